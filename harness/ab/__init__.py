"""`accelharness ab`: two variants of one model (two files, two package versions, two Pythons) measured
interleaved, round by round, natively (each variant in its own worker process) and in one page; the
paired verdict is analysis's (harness.analysis.paired). run.py plans and runs it, rounds.py is its round
schedule, worker.py a variant's process (possibly in another Python), web.py both variants in one page."""
