"""The parts of ``minidist run``'s launcher (:mod:`minidist.launcher` runs the job with
them), one job each: :mod:`.options` (what it was asked to do), :mod:`.secret` (the
job's secret), :mod:`.ranks` (starting a rank's process), :mod:`.processes` (the
ranks' processes once started: exit codes, stopping them), :mod:`.output` (relaying
their output) and :mod:`.failures` (which rank failed first, and the closing lines).
"""
