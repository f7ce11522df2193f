"""`helios serve --speculative-config` end to end: real gunicorn, the official client, /metrics."""

from __future__ import annotations

import random
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.e2e.conftest import REPO_ROOT, RunningServer, running_server
from tests.support.prometheus import Scrape

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.model]

NGRAM = (
    '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, '
    '"prompt_lookup_max": 3}'
)


@pytest.fixture(scope="module")
def speculative_server(
    e2e_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    workdir = tmp_path_factory.mktemp("e2e-speculative")
    with running_server(e2e_model_dir, workdir, "--speculative-config", NGRAM) as running:
        yield running


def client_of(server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="x", max_retries=0)


def repeated_prompts(count: int) -> list[list[int]]:
    generator = random.Random(11)
    prompts = []
    for _ in range(count):
        phrase = [generator.randrange(4, 300) for _ in range(generator.randint(3, 6))]
        prompts.append(phrase * 3 + phrase[:2])
    return prompts


def test_speculation_serves_the_same_greedy_completions_with_target_logprobs(
    server: RunningServer, speculative_server: RunningServer
):
    prompts = repeated_prompts(8)
    request = dict(
        prompt=prompts, max_tokens=24, temperature=0, logprobs=5, extra_body={"ignore_eos": True}
    )
    models = {s: client_of(s).models.list().data[0].id for s in (server, speculative_server)}

    plain = client_of(server).completions.create(model=models[server], **request)
    speculative = client_of(speculative_server).completions.create(
        model=models[speculative_server], **request
    )

    for a, b in zip(plain.choices, speculative.choices, strict=True):
        assert a.text == b.text
        assert a.logprobs.tokens == b.logprobs.tokens
        for x, y in zip(a.logprobs.token_logprobs, b.logprobs.token_logprobs, strict=True):
            assert abs(x - y) <= 1e-5
    with urllib.request.urlopen(f"{speculative_server.base_url}/metrics", timeout=10) as reply:
        scrape = Scrape(reply.read().decode())
    model = models[speculative_server]
    accepted = scrape.value("vllm:spec_decode_num_accepted_tokens_total", model_name=model)
    offered = scrape.value("vllm:spec_decode_num_draft_tokens_total", model_name=model)
    assert 0 < accepted <= offered


def test_a_malformed_speculative_config_stops_the_server_before_it_starts(tmp_path: Path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "adapters.cli.main",
            "serve",
            "--speculative-config",
            '{"method": "ngram", "num_speculative_tokens": 0}',
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert result.returncode == 2
    assert "num_speculative_tokens must be a positive integer" in result.stderr
