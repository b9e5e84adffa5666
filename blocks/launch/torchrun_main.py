"""``python -m blocks.launch.torchrun_main ARGS``: the torchrun process (:func:`blocks.launch.torchrun.main`).

A module of its own, which nothing imports: multiprocessing runs the main module again, by
name, in every worker it forks, and each worker has imported :mod:`blocks.launch.torchrun`
already (the driver's and the workers' shared names live there). Running an imported module
would execute it a second time, with a ``RuntimeWarning`` from ``runpy``.
"""

from blocks.launch.collector import own_this_process, skip_final_collection
from blocks.launch.torchrun import main

if __name__ == "__main__":
    own_this_process()
    try:
        main()
    finally:
        skip_final_collection()
