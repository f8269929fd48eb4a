"""A simulator of SPMD training jobs that hang: the verification machine of the hang analysis.

Programs are generated (`program.py`) on a random device mesh (`mesh.py`), one rank departs from its
program in one of the ways jobs really depart (`departures.py`), the ranks are played under gloo's or
NCCL's semantics until the job deadlocks (`engine.py`), and the artifacts a real job leaves are written
(`artifacts.py`: flight-recorder dumps in torch's pickle layout, every thread's stack as py-spy or the
watchdog prints it, the logs' timeout lines). `truth.py` says, from the simulation alone, which rank
departed, where, and whether any artifact can tell it apart from its peers; `case.py` ties one seeded
case together and scores a verdict against its truth.

Nothing here imports torchtriage's analysis: the simulator knows what the job did, the analysis only what
it left behind.
"""
