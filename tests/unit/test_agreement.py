"""The rendezvous' agreements (shrink, agree) without sockets: fake clients collect the
replies; liveness is a dict the test changes."""

from __future__ import annotations

import pytest

from minidist.rendezvous.agreement import Agreements, expand, runs


class Client:
    def __init__(self) -> None:
        self.got: list[dict] = []

    def send(self, body: dict) -> None:
        self.got.append(body)


def setup(n: int):
    alive = {r: 0 for r in range(n)}
    return alive, Agreements(lambda r: alive.get(r)), [Client() for _ in range(n)]


def ask(a, clients, r, kind="shrink", seq=0, members=None, exclude=(), flag=True,
        group=5, incarnations=None):
    members = list(range(len(clients))) if members is None else members
    body = {"t": "agree", "id": 100 + r, "kind": kind, "group": group, "seq": seq,
            "runs": runs(members), "exclude": list(exclude), "flag": flag}
    if incarnations:
        body["incarnations"] = incarnations
    a.ask(clients[r], r, body)


def test_runs_round_trip():
    for ranks in ([0, 1, 2, 3], [0, 2, 3, 7, 8, 9], [5], []):
        assert list(expand(runs(ranks))) == ranks
    assert runs(list(range(1024))) == [[0, 1024]]
    with pytest.raises(ValueError):
        expand([[3, 3]])


def test_every_caller_gets_the_same_answer_only_once_all_asked():
    alive, a, cl = setup(4)
    del alive[3]
    for r in (0, 1):
        ask(a, cl, r, exclude=[3])
    assert not any(c.got for c in cl)  # rank 2 has not asked yet
    ask(a, cl, 2, exclude=[3])
    answers = [c.got[0] for c in cl[:3]]
    assert all(x["excluded"] == [3] and x["gone"] == [] for x in answers)
    assert len({x["epoch"] for x in answers}) == 1 and answers[0]["epoch"] >= 1
    assert [x["id"] for x in answers] == [100, 101, 102]


def test_a_member_dying_while_the_others_wait_is_left_out():
    alive, a, cl = setup(4)
    for r in (0, 1, 3):
        ask(a, cl, r)
    assert not any(c.got for c in cl)
    del alive[2]
    a.gone(2)
    answers = [cl[r].got[0] for r in (0, 1, 3)]
    assert all(x["gone"] == [2] for x in answers)
    # one that asked and then died is left out too
    alive2, b, cl2 = setup(3)
    ask(b, cl2, 0, kind="and", flag=False)
    del alive2[0]
    b.gone(0)
    ask(b, cl2, 1, kind="and")
    ask(b, cl2, 2, kind="and")
    assert cl2[1].got[0]["value"] is True and cl2[1].got[0]["gone"] == [0]


def test_agree_is_the_and_of_the_live_callers():
    _, a, cl = setup(3)
    for r, flag in ((0, True), (1, False), (2, True)):
        ask(a, cl, r, kind="and", flag=flag)
    assert [c.got[0]["value"] for c in cl] == [False, False, False]
    _, b, cl = setup(2)
    for r in (0, 1):
        ask(b, cl, r, kind="and", seq=1)
    assert [c.got[0]["value"] for c in cl] == [True, True]


def test_a_restarted_member_counts_as_gone_for_the_group_made_before():
    alive, a, cl = setup(3)
    alive[2] = 1  # rank 2 is a new process now; the group was made with incarnation 0
    ask(a, cl, 0)
    ask(a, cl, 1)
    assert cl[0].got[0]["gone"] == [2]
    # a group made with the new process waits for it
    ask(a, cl, 0, group=6, incarnations={"2": 1})
    ask(a, cl, 1, group=6, incarnations={"2": 1})
    assert len(cl[0].got) == 1
    ask(a, cl, 2, group=6, incarnations={"2": 1})
    assert cl[0].got[1]["gone"] == [] and len(cl[2].got) == 1


def test_bad_requests_get_an_error_and_change_nothing():
    _, a, cl = setup(3)
    ask(a, cl, 0, members=[0, 1, 2])
    ask(a, cl, 1, members=[0, 1])  # another member list for the same call
    assert "another member" in cl[1].got[0]["error"]
    ask(a, cl, 2, exclude=[2])  # a rank that excludes itself
    assert "excluded" in cl[2].got[0]["error"]
    a.ask(cl[1], 1, {"t": "agree", "id": 1, "kind": "bogus", "runs": [[0, 3]]})
    assert "bad agreement request" in cl[1].got[1]["error"]
    assert not cl[0].got  # still waiting for ranks 1 and 2 as before
    ask(a, cl, 1)
    ask(a, cl, 2)
    assert cl[0].got[0]["excluded"] == [] and cl[0].got[0]["gone"] == []
