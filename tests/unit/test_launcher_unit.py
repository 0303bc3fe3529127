"""What `minidist run` imports before forking, read from a script's compiled code."""

from minidist.launch import ranks


def imports(source: str) -> list[str]:
    return ranks.heavy_imports(compile(source, "script.py", "exec"))


def test_torch_imported_at_the_top_of_a_script_is_preloaded_with_minidist_torch():
    for source in ("import torch\n", "import torch.nn as nn\n", "from torch import nn\n",
                   "import minidist.torch as dist\n", "from minidist import torch\n",
                   "import os\nif os.environ.get('X'):\n    import torch\n",
                   "try:\n    import torch\nexcept ImportError:\n    pass\n"):
        assert imports(source) == ["torch", "minidist.torch"], source


def test_imports_inside_functions_and_other_libraries_are_left_to_the_ranks():
    for source in ("def main():\n    import torch\n", "import numpy\nimport json\n",
                   "from minidist import ReduceOp\n", "import torchvision_like_name_x\n",
                   "x = 'import torch'\n"):
        assert imports(source) == [], source
    assert ranks.heavy_imports(None) == []


def test_shared_environment_hands_down_what_every_rank_has_and_restores(monkeypatch):
    import os

    from minidist.launch import ranks

    monkeypatch.setenv("MD_TEST_KEPT", "launcher's")
    monkeypatch.delenv("MD_TEST_NEW", raising=False)
    envs = [(r, {"MD_TEST_KEPT": "ranks'", "MD_TEST_NEW": "x", "RANK_X": str(r)})
            for r in range(3)]
    with ranks.shared_environment(envs) as own:
        assert own == [(r, {"RANK_X": str(r)}) for r in range(3)]
        assert os.environ["MD_TEST_KEPT"] == "ranks'" and os.environ["MD_TEST_NEW"] == "x"
        assert "RANK_X" not in os.environ
    assert os.environ["MD_TEST_KEPT"] == "launcher's" and "MD_TEST_NEW" not in os.environ
    with ranks.shared_environment([]) as own:
        assert own == []


def test_a_forked_rank_sets_only_the_signals_the_launcher_changed():
    import signal

    from minidist.launch import ranks

    before = signal.getsignal(signal.SIGTERM)
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        assert signal.SIGTERM not in [s for s, _ in ranks.signals_to_reset()]
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        assert (signal.SIGTERM, signal.SIG_DFL) in ranks.signals_to_reset()
    finally:
        signal.signal(signal.SIGTERM, before)
