"""``minidist bench``: the size / time / algbw / busbw table of nccl-tests, for minidist
and, side by side in the same invocation, torch's gloo and MPI (mpi4py).

Layout:

* :mod:`.report`: the pure parts (sizes, element counts, bus-bandwidth factors, the
  table, the JSON document, the plot). No processes, no sockets.
* :mod:`.runner`: the parent. It starts one job of ``n`` processes per system on this
  node, collects the lines its rank 0 prints, and kills every process tree on an error,
  a timeout or Ctrl-C.
* :mod:`.worker`: what every rank runs (``python -m minidist.bench.worker``): the timed
  loop over the sizes, for minidist, gloo or MPI.
* :mod:`.cli`: the ``minidist bench`` subcommand.
"""
