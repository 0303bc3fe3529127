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
