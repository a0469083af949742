"""HiFi-GAN against jik876/hifi-gan: its V1, V2 and V3 generators, given the reference's weights
(``conftest.formula_state``, in its key names, read by ``Published.read``) and input, compute the reference's audio
(``tests/data/reference``, whose README says how it was made); its V3 files import."""

import pytest
import torch
from conftest import (assert_close, formula_state, import_published, mel_input, reference_config, reference_fixture,
                      reference_model)

from models import MODELS

pytestmark = [pytest.mark.skipif("hifigan" not in MODELS, reason="no HiFi-GAN in this project"),
              pytest.mark.filterwarnings("error::DeprecationWarning", "error::FutureWarning")]


def generator_settings(meta) -> dict:
    """The reference's generator config (``resblock`` is a string there) as this project's ``hifigan`` settings."""
    return {"hifigan": {**meta["config"], "resblock": int(meta["config"]["resblock"])}}


@pytest.mark.parametrize("version", ["v1", "v2", "v3"])
def test_the_generator_computes_jik876s_audio(version):
    arrays, meta = reference_fixture(f"net_hifigan_{version}.npz")
    cfg = reference_config(**generator_settings(meta))
    model = reference_model("hifigan", cfg, MODELS["hifigan"].published.read({"generator": formula_state(meta)}, cfg))
    with torch.no_grad():
        audio = model.generator(mel_input(6))
    assert_close(audio, arrays["audio"], f"HiFi-GAN {version} audio")


def test_a_v3_generator_file_imports(tmp_path):
    """V3's residual blocks (type 2) are ``resblocks.<n>.convs.<m>`` in jik876's files."""
    _, meta = reference_fixture("net_hifigan_v3.npz")
    theirs = formula_state(meta)
    torch.save({"generator": theirs}, tmp_path / "g_v3")
    saved, line = import_published(tmp_path, tmp_path / "g_v3", generator_settings(meta))
    assert "from jik876/hifi-gan's generator file" in line
    assert torch.equal(saved["model"]["generator.mrfs.1.blocks.2.dilated.1.parametrizations.weight.original1"],
                       theirs["resblocks.5.convs.1.weight_v"])  # resblocks.<3 i + j> -> mrfs.<i>.blocks.<j>
