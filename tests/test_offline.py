"""A hub id without network is a one-line error at once, not after the hub client's retries."""

import time

import pytest

from eagle_mdsd import checkpoint, models
from eagle_mdsd.errors import MissingFile, UsageError


def test_the_hub_is_out_of_reach_when_offline_is_set_or_its_endpoint_refuses(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert models.hub_offline()
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the discard port: nothing listens there
    assert models.hub_offline()


@pytest.mark.parametrize("offline", ["HF_HUB_OFFLINE", "HF_ENDPOINT"])
def test_a_hub_id_offline_is_a_one_line_error_in_under_5_seconds(offline, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HOME", str(tmp_path))  # an empty hub cache
    if offline == "HF_HUB_OFFLINE":
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    else:
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    started = time.monotonic()
    with pytest.raises(UsageError, match="cannot load base model lmsys/vicuna-7b-v1.3: the hub is out of reach") as error:
        models.load_target("lmsys/vicuna-7b-v1.3")
    assert "\n" not in str(error.value)
    with pytest.raises(MissingFile, match="the hub is out of reach and its cache has no copy") as error:
        checkpoint.head_folder("yuhuili/EAGLE-Vicuna-7B-v1.3")
    assert "\n" not in str(error.value)
    assert time.monotonic() - started < 5
