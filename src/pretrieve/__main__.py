"""``python -m pretrieve`` = the ``pretrieve`` command (also what torchrun/accelerate launch run)."""

from pretrieve.cli import main

if __name__ == "__main__":
    main()
