"""The dashboard's Replicas card in Debian's chromium, headless (as tests/test_ui.py drives the
page): one row per replica from `/v1/stats` with its role and the KV transfers it received, a
restarting one marked, and the card hidden for a single engine, whose figures the other cards
already show; and speculative decoding's acceptance, shown only by a server that speculates."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.server_harness import base_url, running_server, simulated_engine
from tests.test_ui import EMPTY_WINDOW, WAIT_MS, screenshot


def _replica(replica_id: int, **fields) -> dict:
    return {
        "id": replica_id,
        "node": "node-a",
        "pid": 4100 + replica_id,
        "healthy": True,
        "running": 0,
        "waiting": 0,
        "kv_cache_usage": 0.0,
        "requests_in_flight": 0,
        "requests_routed": 0,
        "requests_finished": 0,
        "prefix_cache_hits": 0,
        "prefix_cache_queries": 0,
        "role": "both",
        "kv_transfers": {"count": 0, "failed": 0, "bytes": 0, "mean_ms": 0.0},
        **fields,
    }


TWO_REPLICAS = [
    _replica(
        0,
        running=3,
        waiting=1,
        kv_cache_usage=0.25,
        requests_in_flight=4,
        requests_routed=12,
        requests_finished=8,
        prefix_cache_hits=96,
        prefix_cache_queries=128,
        role="prefill",
    ),
    _replica(
        1,
        node="node-b",
        healthy=False,
        requests_routed=5,
        requests_finished=5,
        role="decode",
        kv_transfers={"count": 5, "failed": 1, "bytes": 3 * 1024 * 1024, "mean_ms": 2.25},
    ),
]
KV_TRANSFERS = {"count": 5, "failed": 1, "bytes": 3 * 1024 * 1024, "mean_ms": 2.25}


@pytest.fixture
def dashboard(browser: Browser, llama_checkpoint) -> Iterator[tuple[Page, list[dict]]]:
    """The dashboard over a server whose `/v1/stats` answers the last of the yielded list of
    snapshots; uncaught script errors fail the test."""
    answers: list[dict] = []
    errors: list[str] = []
    with running_server(simulated_engine(llama_checkpoint)) as state:
        context = browser.new_context(viewport={"width": 1200, "height": 900})
        page = context.new_page()
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.route(
            "**/v1/stats",
            lambda route: route.fulfill(
                status=200, content_type="application/json", body=json.dumps(answers[-1])
            ),
        )
        answers.append({**EMPTY_WINDOW, "replicas": TWO_REPLICAS, "kv_transfers": KV_TRANSFERS})
        page.goto(base_url(state) + "/dashboard.html")
        yield page, answers
        context.close()
    assert not errors, f"uncaught errors in the page: {errors}"


def _cells(page: Page, replica_id: int) -> list[str]:
    return page.locator(f"#replicas-card tr[data-replica='{replica_id}'] td").all_inner_texts()


def test_replicas_card_lists_each_replica_and_marks_a_restarting_one(dashboard):
    page, answers = dashboard
    card = page.locator("#replicas-card")
    expect(card).to_be_visible(timeout=WAIT_MS)
    expect(card.locator("tbody tr")).to_have_count(2)
    expect(card.locator("[data-field=replicas-serving]")).to_have_text("1 of 2")
    # id, node, pid, state; running, waiting, KV cache; in flight, routed, finished, hits;
    # role, KV transfers received
    assert _cells(page, 0) == [
        *("0", "node-a", "4100", "serving"),
        *("3", "1", "25%"),
        *("4", "12", "8", "75%"),
        *("prefill", "–"),
    ]
    assert _cells(page, 1)[:4] == ["1", "node-b", "4101", "restarting"]
    assert _cells(page, 1)[8:] == ["5", "5", "–", "decode", "5 (1 failed) · 3.0 MiB · 2.3 ms"]
    expect(card.locator("[data-field=kv-transfers]")).to_have_text(
        "5 (1 failed) · 3.0 MiB · 2.3 ms"
    )
    expect(card.locator("tr[data-replica='1']")).to_have_attribute("data-state", "restarting")
    screenshot(page, "dashboard-replicas")
    # The replica comes back with a new process; a poll later the card says so.
    answers.append({**EMPTY_WINDOW, "replicas": [TWO_REPLICAS[0], _replica(1, pid=4242)]})
    expect(card.locator("[data-field=replicas-serving]")).to_have_text("2 of 2", timeout=WAIT_MS)
    assert _cells(page, 1)[2:4] == ["4242", "serving"]


def test_replicas_card_is_hidden_for_a_single_engine(dashboard):
    page, answers = dashboard
    card = page.locator("#replicas-card")
    expect(card).to_be_visible(timeout=WAIT_MS)
    answers.append({**EMPTY_WINDOW, "replicas": [_replica(0)]})
    expect(card).to_be_hidden(timeout=WAIT_MS)
    answers.append({**EMPTY_WINDOW, "replicas": TWO_REPLICAS})
    expect(card).to_be_visible(timeout=WAIT_MS)
    # A server from before replicas (no list at all) hides it too.
    answers.append(EMPTY_WINDOW)
    expect(card).to_be_hidden(timeout=WAIT_MS)
    expect(card.locator("tbody tr")).to_have_count(0)


def test_speculation_shows_its_acceptance_only_on_a_server_that_speculates(dashboard):
    page, answers = dashboard
    figure = page.locator("#spec-figure")
    expect(page.locator("#replicas-card")).to_be_visible(timeout=WAIT_MS)
    expect(figure).to_be_hidden()
    spec = {
        "num_drafts": 40,
        "num_draft_tokens": 160,
        "num_accepted_tokens": 124,
        "accepted_per_position": [38, 33, 28, 25],
        "acceptance_rate": 124 / 160,
        "mean_acceptance_length": (124 + 40) / 40,
    }
    answers.append({**EMPTY_WINDOW, "spec_decode": spec})
    expect(figure).to_be_visible(timeout=WAIT_MS)
    expect(figure.locator("[data-field=spec-decode]")).to_have_text("78% · 4.10 tok a step")
    answers.append({**EMPTY_WINDOW, "spec_decode": None})
    expect(figure).to_be_hidden(timeout=WAIT_MS)
