"""The after-training tools on sharded checkpoint folders (``train.parallelism=fsdp``): ``scripts.import_weights`` and
``scripts.export`` refuse a folder holding code in one line, and an honest folder imports to the weights it holds (and
the mel framing it records) and consolidates to alike. The crafted folders and the run that writes them are
``tests/test_checkpoint_folders.py``'s; the tools' calls ``tests/test_published.py``'s."""


import pytest
import torch
from conftest import TEST_MODEL, run_main
from test_checkpoint_folders import FOLDER_MODEL, FOLDER_ROUTES, sharded  # noqa: F401 (fixture)
from test_checkpoint_safety import assert_refused, craft
from test_published import tool_calls
from test_sharded_checkpoint import unchecked_folder

from models import MODELS
from parts import config_schemas
from utils.checkpoint.sharded import FOLDER, read_train_state, sharded_intact
from utils.config import config_from_dict

pytestmark = pytest.mark.skipif(TEST_MODEL is None, reason="no model is registered in models/__init__.py")


@pytest.mark.parametrize("tool", ["import_weights", "export"])
@pytest.mark.parametrize("route", sorted(FOLDER_ROUTES))
def test_a_sharded_folder_holding_code_is_refused_by_the_tools(sharded, tmp_path, route, tool):  # noqa: F811
    _, out = sharded
    path, marker = craft(route, out / "checkpoint_2", tmp_path, FOLDER_ROUTES)
    assert sharded_intact(path).startswith("unsafe: ") and "holds code" in sharded_intact(path)
    done = tool_calls(tmp_path)[tool](path)
    assert_refused(done.returncode, done.stderr, marker, path)


def test_an_honest_sharded_folder_imports_and_consolidates_to_the_same_weights(sharded, tmp_path):  # noqa: F811
    _, out = sharded
    name = FOLDER_MODEL or TEST_MODEL
    done = run_main("scripts.import_weights", str(out / "checkpoint_2"), "--tiny", "--output",
                    str(tmp_path / "imported.pt"))
    assert f"model '{name}' from a sharded checkpoint of model '{name}' at step 2" in done.stdout
    run_main("scripts.consolidate_checkpoint", str(out / "checkpoint_2"), "--output", str(tmp_path / "whole.pt"))
    imported = torch.load(tmp_path / "imported.pt", weights_only=True)
    assert imported["config"]["audio"]["mel_framing"] == read_train_state(out / "checkpoint_2")["config"]["audio"][
        "mel_framing"]  # the framing the folder's weights were trained on
    imported = imported["model"]
    whole = torch.load(tmp_path / "whole.pt", weights_only=True)
    assert whole["step"] == 2 and whole["optimizer"]["param_groups"][0]["lr"] > 0
    model = MODELS[name].build_model(config_from_dict(read_train_state(out / "checkpoint_2")["config"],
                                                             config_schemas()))
    FOLDER.load_weights(out / "checkpoint_2", model)
    for key, value in model.state_dict().items():
        assert torch.equal(imported[key], value) and torch.equal(whole["model"][key], value), key


@pytest.mark.slow  # a whole checkpoint written, damaged and exported
def test_a_folder_without_its_checksums_exports_with_a_line_saying_so(tmp_path):
    """A folder written before checksums (or copied without its checksums.json): a bit flip in it cannot be found, so
    ``scripts.export`` warns once that its weights are unverified, then writes the release file (its main in this
    process: what is proven is what it reads and says, not the launch)."""
    folder, warning = unchecked_folder(tmp_path)
    done = run_main("scripts.export", "--checkpoint", str(folder), "--format", "release", "--output",
                    str(tmp_path / "release.pt"), check=False)
    assert done.returncode == 0 and done.stderr.splitlines().count(warning) == 1, done.stderr
    assert "checksums.json" not in done.stderr.replace(warning, "") and (tmp_path / "release.pt").is_file(), done.stderr
