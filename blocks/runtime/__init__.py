"""The build layer: plans into Lightning objects (imports torch and Lightning)."""
