"""Programmatic dependent launch: where it applies, and the switch that turns it off."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from cgtool.runtime import dependent_launch


def test_an_ordinary_launch_off_the_gpu_and_when_turned_off(monkeypatch):
    assert dependent_launch.dependent_launch(torch.device("cpu")) == {"PDL": False}
    assert not dependent_launch.in_effect(torch.device("cpu"))
    monkeypatch.setattr(dependent_launch, "DEPENDENT_LAUNCH", False)
    assert dependent_launch.dependent_launch(torch.device("cuda", 0)) == {"PDL": False}
    assert not dependent_launch.in_effect(torch.device("cuda", 0))


@pytest.mark.gpu
def test_a_dependent_launch_on_hopper():
    options = dependent_launch.dependent_launch(torch.device("cuda", 0))
    hopper = torch.cuda.get_device_capability(0)[0] >= 9
    assert options == ({"PDL": True, "launch_pdl": True} if hopper else {"PDL": False})
    assert dependent_launch.in_effect(torch.device("cuda", 0)) == hopper


@pytest.mark.parametrize("value,expected", [("0", False), ("1", True), (None, True)])
def test_the_environment_variable_turns_it_off_for_a_process(value, expected):
    env = {k: v for k, v in os.environ.items() if k != dependent_launch.DEPENDENT_LAUNCH_ENV}
    if value is not None:
        env[dependent_launch.DEPENDENT_LAUNCH_ENV] = value
    code = "from cgtool.runtime import dependent_launch; print(dependent_launch.DEPENDENT_LAUNCH)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(expected)
