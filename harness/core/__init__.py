"""What every part shares and nothing else: the records a run produces (records), the labels and
marks every reader prints (labels), statistics over samples (stats) and the parity check (parity).

core imports no other part of harness: every other part may import it.
"""
