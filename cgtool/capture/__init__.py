"""One capture session, its modules importing downward only:

options (what to do, what was gathered) <- memory, timing <- measure <- workbench <- kinds
(each graph kind's sizes loop) <- ranks (TP gathering) <- session (run_capture, reports)
<- launch, tp (one session per rank).
"""
