"""The Ray-free core: what every worker runs before the user's code.

torchrun, SLURM and horovodrun users import only this half: devices,
launcher environment, initialization and object collectives need torch alone.
"""
