"""The shared-memory paths of one node, in one place: the segments' layouts and their
ordering argument, the pure-Python executor, the compiled one, and the interface a
session calls.

The interface (what :mod:`minidist.session` and :mod:`minidist.door` call):

* :mod:`.calls` runs a group's small collectives on the caller's thread
  (:class:`~.calls.FastCalls`), :mod:`.planner` decides which calls take them;
* :mod:`.p2p` sends and receives through inboxes (:class:`~.p2p.FastP2P`), and
  :mod:`.first_k` takes the first k messages (``recv_many``);
* :mod:`.repeat`, :mod:`.routes` and :mod:`.takes` remember a blocking call that repeats
  (an RL step's scatter, gather, send or receive) and run it again at once;
* :mod:`.group_segments` and :mod:`.shared_setup` map a group's segments;
  :mod:`.algorithm_calls` runs the ``shared_memory`` algorithm's calls.

The layouts and the pure executor: :mod:`.fast_slots` (all_reduce, broadcast and
barrier slots; the futex waits and the spin/yield patience every path uses),
:mod:`.area_layout` and :mod:`.rooted_area` (scatter, gather, all_gather: the rooted
area), :mod:`.waits` (a rooted call's bounded waits), :mod:`.inbox` (a receiver's rings).

The compiled executor: ``_core`` (built from ``_core.c``; :mod:`.core` says whether it
is in use and why), which runs the same protocol: :mod:`.rooted_core` hands it a rooted
role, and a remembered call of :mod:`.repeat`, :mod:`.routes` or :mod:`.takes` is one
call into it.
"""
