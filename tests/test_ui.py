"""The chat UI and the dashboard in Debian's chromium, headless, driven by Playwright: replies
stream in steps with their stats, Stop and Esc cancel, the dashboard follows requests from
several tabs, a wrong API key and an overloaded server are explained, the page reconnects after
a restart, and model output can never become markup. Screenshots go to test-artifacts/ui/."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect

from baton.core.simulation.simulated_executor import SimulatedExecutor
from tests.server_harness import base_url, running_server, simulated_engine

ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts" / "ui"
# Seconds per engine step: slow enough that a reply arrives in many token frames.
STEP_S = 0.01
WAIT_MS = 15_000
LONG_REPLY = 2000  # tokens; at STEP_S a reply this long outlives any test


class PacedExecutor(SimulatedExecutor):
    """Simulated tokens at a steady pace: each step takes STEP_S of wall time."""

    def execute(self, batch):
        time.sleep(STEP_S)
        return super().execute(batch)


def paced_engine(checkpoint: Path, **config):
    engine = simulated_engine(checkpoint, **config)
    engine.executor = PacedExecutor(4096, 16, engine.vocab_size)
    return engine


@pytest.fixture(scope="module")
def server(llama_checkpoint):
    with running_server(paced_engine(llama_checkpoint), model_name="tiny-ui") as state:
        yield state


@pytest.fixture
def open_page(browser: Browser):
    """`open_page(url, **context_options)`: a page in a fresh context (its own localStorage);
    uncaught script errors fail the test."""
    contexts = []
    errors: list[str] = []

    def open_(url: str, **options) -> Page:
        context = options.pop("context", None)
        if context is None:
            context = browser.new_context(**options)
            contexts.append(context)
        page = context.new_page()
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(url)
        return page

    yield open_
    for context in contexts:
        context.close()
    assert not errors, f"uncaught errors in the page: {errors}"


def screenshot(page: Page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")


def connected(page: Page) -> Page:
    expect(page.locator("#connection-status")).to_have_attribute(
        "data-state", "open", timeout=WAIT_MS
    )
    return page


def page_recording_sent_frames(open_page, url: str) -> tuple[Page, list[dict]]:
    """A connected page and the list every WebSocket frame it sends is appended to (decoded)."""
    page = connected(open_page(url))
    frames: list[dict] = []
    page.on(
        "websocket",
        lambda ws: ws.on("framesent", lambda payload: frames.append(json.loads(payload))),
    )
    # The socket opened before the listener: reload so the recorded one carries the requests.
    page.reload()
    return connected(page), frames


def set_params(page: Page, max_tokens: int, ignore_eos: bool = True) -> None:
    page.click("#toggle-settings")
    page.fill("#max-tokens", str(max_tokens))
    page.locator("#ignore-eos").set_checked(ignore_eos)
    page.keyboard.press("Escape")
    expect(page.locator("#settings")).to_be_hidden()


def send(page: Page, text: str) -> None:
    page.fill("#prompt", text)
    page.press("#prompt", "Enter")


def last_reply(page: Page):
    return page.locator(".message.assistant").last


def test_page_and_its_modules_are_served_with_their_types(server):
    url = base_url(server)
    page = httpx.get(url + "/")
    assert page.status_code == 200
    assert '<script type="module" src="js/chat.js">' in page.text
    for path in ("/js/chat.js", "/js/markdown.js", "/js/dashboard.js"):
        script = httpx.get(url + path)
        assert script.status_code == 200
        # Browsers refuse module scripts served with any other type.
        assert script.headers["content-type"].split(";")[0] in (
            "text/javascript",
            "application/javascript",
        )
    assert httpx.get(url + "/dashboard.html").status_code == 200


def test_reply_streams_in_steps_and_shows_its_stats(server, open_page):
    page = connected(open_page(base_url(server)))
    expect(page.locator("#model-name")).to_have_text("tiny-ui")
    set_params(page, max_tokens=64)
    # Every render of the reply, recorded in the page: the text must grow while streaming.
    page.evaluate(
        """() => {
            window.replyLengths = [];
            new MutationObserver(() => {
                const reply = document.querySelector('.message.assistant');
                if (reply && reply.dataset.state === 'streaming') {
                    const length = reply.querySelector('.message-content').textContent.length;
                    if (length && window.replyLengths.at(-1) !== length) {
                        window.replyLengths.push(length);
                    }
                }
            }).observe(document.getElementById('messages'), {subtree: true, childList: true});
        }"""
    )
    send(page, "Tell me about the for statement.")
    expect(page.locator(".message.user .message-content")).to_have_text(
        "Tell me about the for statement."
    )
    reply = last_reply(page)
    expect(reply).to_have_attribute("data-state", "done", timeout=WAIT_MS)
    lengths = page.evaluate("window.replyLengths")
    assert len(lengths) >= 2, f"the reply appeared in one piece: {lengths}"
    assert lengths == sorted(lengths)
    assert reply.locator(".message-content").text_content()
    expect(reply).to_have_attribute("data-finish", "length")
    expect(reply.locator("[data-stat=tokens] .stat-value")).to_have_text("64")
    expect(reply.locator("[data-stat=ttft] .stat-value")).to_have_text(
        re.compile(r"^\d+(\.\d)? (ms|s)$")
    )
    expect(reply.locator("[data-stat=rate] .stat-value")).to_have_text(
        re.compile(r"^\d+\.\d tok\/s$")
    )
    expect(reply.locator("[data-stat=queue] .stat-value")).to_have_text(re.compile(r"ms|s$"))
    expect(reply.locator("[data-stat=cached] .stat-value")).to_have_text(re.compile(r"^\d+\/\d+$"))
    expect(reply.get_by_role("button", name="Regenerate")).to_be_visible()
    # The conversation is kept: a reload shows it again, listed under its first message.
    page.reload()
    expect(page.locator(".message.assistant")).to_have_count(1)
    expect(page.locator("#conversation-list [aria-current=true]")).to_have_text(
        "Tell me about the for statement."
    )
    screenshot(page, "chat-light-desktop")
    page.click("#toggle-settings")
    expect(page.locator("#system-prompt")).to_be_focused()
    expect(page.locator("#max-tokens")).to_have_value("64")
    screenshot(page, "chat-settings-light-desktop")


def test_conversations_keep_their_own_history_and_settings_shape_the_request(server, open_page):
    page, frames = page_recording_sent_frames(open_page, base_url(server))
    page.click("#toggle-settings")
    page.fill("#system-prompt", "Answer briefly.")
    page.fill("#temperature", "0")
    page.select_option("#slo-class", "batch")
    page.fill("#max-tokens", "8")
    page.keyboard.press("Escape")
    send(page, "First conversation")
    expect(last_reply(page)).to_have_attribute("data-state", "done", timeout=WAIT_MS)
    generate = frames[-1]
    assert generate["type"] == "generate"
    assert generate["messages"] == [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "First conversation"},
    ]
    assert generate["temperature"] == 0
    assert generate["max_tokens"] == 8
    assert generate["priority"] == 10
    assert generate["slo"] == {"ttft_ms": 60000, "tpot_ms": 2000}

    page.click("#new-chat")
    expect(page.locator(".message")).to_have_count(0)
    send(page, "Second conversation")
    expect(last_reply(page)).to_have_attribute("data-state", "done", timeout=WAIT_MS)
    conversations = page.locator("#conversation-list .conversation-open")
    expect(conversations).to_have_text(["Second conversation", "First conversation"])

    conversations.filter(has_text="First conversation").click()
    expect(page.locator(".message.user .message-content")).to_have_text(["First conversation"])
    page.get_by_role("button", name="Delete “Second conversation”").click()
    expect(conversations).to_have_text(["First conversation"])


def test_stop_button_and_escape_cancel_a_long_reply(server, open_page):
    page = connected(open_page(base_url(server)))
    set_params(page, max_tokens=LONG_REPLY)
    send(page, "Count to a million.")
    reply = last_reply(page)
    expect(reply.locator(".message-content")).not_to_be_empty(timeout=WAIT_MS)
    page.click("#stop")
    expect(reply).to_have_attribute("data-finish", "cancelled", timeout=WAIT_MS)
    expect(reply.locator(".finish-badge")).to_have_text("Stopped")
    expect(page.locator("#send")).to_be_visible()
    tokens = int(reply.locator("[data-stat=tokens] .stat-value").inner_text())
    assert 0 < tokens < LONG_REPLY

    page.get_by_role("button", name="Regenerate").click()
    reply = last_reply(page)
    expect(reply.locator(".message-content")).not_to_be_empty(timeout=WAIT_MS)
    page.keyboard.press("Escape")
    expect(reply).to_have_attribute("data-finish", "cancelled", timeout=WAIT_MS)
    expect(page.locator(".message.assistant")).to_have_count(1)
    deadline = time.monotonic() + 5
    while server.engine.engine.num_running and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.engine.engine.num_running == 0


@pytest.mark.slow
def test_dashboard_follows_requests_from_several_tabs(server, open_page):
    url = base_url(server)
    dashboard = open_page(url + "/dashboard.html", viewport={"width": 1200, "height": 900})
    expect(dashboard.locator("#dash-status")).to_have_text("Live", timeout=WAIT_MS)
    expect(dashboard.locator("[data-field=model]")).to_have_text("tiny-ui")
    expect(dashboard.locator("[data-field=running]")).to_have_text("0", timeout=WAIT_MS)
    finished_before = int(dashboard.locator("[data-field=total-requests]").inner_text())

    chats = [connected(open_page(url)) for _ in range(2)]
    for index, chat in enumerate(chats):
        set_params(chat, max_tokens=LONG_REPLY)
        send(chat, f"Tab {index}: write a long story.")
    for chat in chats:
        expect(last_reply(chat).locator(".message-content")).not_to_be_empty(timeout=WAIT_MS)
    expect(dashboard.locator("[data-field=running]")).to_have_text("2", timeout=WAIT_MS)
    expect(dashboard.locator("[data-field=decode-per-step]")).not_to_have_text("–")
    screenshot(dashboard, "dashboard-light-desktop")

    for chat in chats:
        chat.click("#stop")
        expect(last_reply(chat)).to_have_attribute("data-finish", "cancelled", timeout=WAIT_MS)
    expect(dashboard.locator("[data-field=running]")).to_have_text("0", timeout=WAIT_MS)
    expect(dashboard.locator("[data-field=total-requests]")).to_have_text(str(finished_before + 2))
    # Latency percentiles count completed requests only (a cancelled one has no TPOT to give):
    # one that runs to its token limit fills them, whatever ran before this test.
    set_params(chats[0], max_tokens=4)
    send(chats[0], "Now a short one.")
    expect(last_reply(chats[0])).to_have_attribute("data-finish", "length", timeout=WAIT_MS)
    expect(dashboard.locator("[data-field=total-requests]")).to_have_text(str(finished_before + 3))
    expect(dashboard.locator("[data-field=ttft-p50]")).to_have_text(re.compile(r"\d"))


EMPTY_WINDOW = {
    "model": "tiny-ui",
    "policy": "slo",
    "uptime_s": 3.0,
    "running": 0,
    "waiting": 0,
    "kv_cache_usage": 0.0,
    "window_s": 3.0,
    "requests_finished": 0,
    "throughput": {
        "requests_per_s": 0.0,
        "prompt_tokens_per_s": 0.0,
        "generation_tokens_per_s": 0.0,
    },
    "ttft_ms": {"p50": None, "p90": None, "p99": None},
    "tpot_ms": {"p50": None, "p90": None, "p99": None},
    "slo": {"attainment": None, "goodput_rps": 0.0},
    "steps": {
        "total": 0,
        "batch_size": 0.0,
        "prefill_tokens_per_step": 0.0,
        "decode_tokens_per_step": 0.0,
        "step_ms_p50": None,
    },
    "totals": {"requests": 0, "prompt_tokens": 0, "generation_tokens": 0},
}


def test_dashboard_shows_an_empty_window_and_a_server_without_stats(server, open_page):
    answers = [(200, json.dumps(EMPTY_WINDOW))]

    def stats(route):
        status, body = answers[-1]
        route.fulfill(status=status, content_type="application/json", body=body)

    dashboard = open_page("about:blank")
    dashboard.route("**/v1/stats", stats)
    dashboard.goto(base_url(server) + "/dashboard.html")
    expect(dashboard.locator("#dash-status")).to_have_text("Live", timeout=WAIT_MS)
    expect(dashboard.locator("[data-field=running]")).to_have_text("0")
    for field in ("ttft-p50", "tpot-p99", "slo-attainment", "step-ms"):
        expect(dashboard.locator(f"[data-field={field}]")).to_have_text("–")

    answers.append((404, json.dumps({"error": {"message": "no route /v1/stats"}})))
    expect(dashboard.locator("#banner")).to_contain_text("no /v1/stats endpoint", timeout=WAIT_MS)


# Whether anything is painted in a band of rows above a chart's bottom edge (where the time
# axis's labels sit), read from the canvas's own pixels.
AXIS_PAINTED = """(canvas) => {
    const context = canvas.getContext("2d");
    const ratio = window.devicePixelRatio || 1;
    const top = Math.round((canvas.clientHeight - 14) * ratio);
    const rows = Math.round(8 * ratio);
    const pixels = context.getImageData(0, top, canvas.width, rows).data;
    return pixels.some((value, index) => index % 4 === 3 && value > 0);
}"""


def test_dashboard_pairs_attainment_with_goodput_and_charts_have_time_axes(server, open_page):
    untargeted = {
        **EMPTY_WINDOW,
        "requests_finished": 3,
        "slo": {"attainment": None, "goodput_rps": 1.0},
    }
    targeted = {**untargeted, "slo": {"attainment": 0.5, "goodput_rps": 0.5}}
    answers = [untargeted]
    dashboard = open_page("about:blank")
    dashboard.route(
        "**/v1/stats",
        lambda route: route.fulfill(
            status=200, content_type="application/json", body=json.dumps(answers[-1])
        ),
    )
    dashboard.goto(base_url(server) + "/dashboard.html")
    expect(dashboard.locator("#dash-status")).to_have_text("Live", timeout=WAIT_MS)
    # Requests finished, none with a target: no goodput without an attainment, and a hint.
    expect(dashboard.locator("[data-field=slo-attainment]")).to_have_text("–")
    expect(dashboard.locator("[data-field=goodput]")).to_have_text("–")
    expect(dashboard.locator("#slo-hint")).to_be_visible()
    answers.append(targeted)
    expect(dashboard.locator("[data-field=slo-attainment]")).to_have_text("50%", timeout=WAIT_MS)
    expect(dashboard.locator("[data-field=goodput]")).to_have_text("0.5 req/s")
    expect(dashboard.locator("#slo-hint")).to_be_hidden()
    for chart in ("chart-ttft", "chart-slo", "chart-kv"):
        assert dashboard.locator(f"#{chart}").evaluate(AXIS_PAINTED), chart
    label = dashboard.locator("#chart-ttft").get_attribute("aria-label")
    assert label.startswith("Chart of the last 120 seconds")


def test_dashboard_on_a_phone_in_the_dark(server, open_page):
    dashboard = open_page(
        base_url(server) + "/dashboard.html",
        viewport={"width": 390, "height": 844},
        color_scheme="dark",
    )
    expect(dashboard.locator("#dash-status")).to_have_text("Live", timeout=WAIT_MS)
    grid = dashboard.locator(".dash-grid").bounding_box()
    assert grid is not None and grid["width"] <= 390
    screenshot(dashboard, "dashboard-dark-phone")


def test_wrong_api_key_is_explained_and_the_right_one_connects(llama_checkpoint, open_page):
    with running_server(paced_engine(llama_checkpoint), api_keys=["sesame"]) as state:
        page = open_page(base_url(state))
        page.evaluate("localStorage.setItem('baton.apiKey', 'not-the-key')")
        page.reload()
        expect(page.locator("#connection-status")).to_have_attribute(
            "data-state", "unauthorized", timeout=WAIT_MS
        )
        expect(page.locator("#banner")).to_contain_text("did not accept the API key")
        send(page, "Hello?")
        reply = last_reply(page)
        expect(reply).to_have_attribute("data-state", "error", timeout=WAIT_MS)
        expect(reply.locator(".message-error")).to_contain_text("API key")
        screenshot(page, "chat-wrong-api-key")

        page.click("#banner-action")
        expect(page.locator("#api-key")).to_be_focused()
        page.fill("#api-key", "sesame")
        page.press("#api-key", "Enter")
        connected(page)
        expect(page.locator("#model-name")).to_have_text("tiny")
        page.get_by_role("button", name="Regenerate").click()
        expect(last_reply(page)).to_have_attribute("data-state", "done", timeout=WAIT_MS)


def test_overloaded_server_is_explained(llama_checkpoint, open_page):
    engine = paced_engine(llama_checkpoint, max_num_seqs=1)
    with running_server(engine, max_queued_requests=0) as state:
        busy = connected(open_page(base_url(state)))
        set_params(busy, max_tokens=LONG_REPLY)
        send(busy, "Take the only slot.")
        expect(last_reply(busy).locator(".message-content")).not_to_be_empty(timeout=WAIT_MS)

        page = connected(open_page(base_url(state), viewport={"width": 390, "height": 844}))
        send(page, "And me?")
        reply = last_reply(page)
        expect(reply).to_have_attribute("data-state", "error", timeout=WAIT_MS)
        expect(reply.locator(".message-error")).to_contain_text("overloaded")
        screenshot(page, "chat-overloaded-phone")
        busy.click("#stop")
        expect(last_reply(busy)).to_have_attribute("data-finish", "cancelled", timeout=WAIT_MS)


def test_page_reconnects_after_a_server_restart(llama_checkpoint, open_page):
    with running_server(paced_engine(llama_checkpoint)) as state:
        port = state.settings.port
        page = connected(open_page(base_url(state)))
    expect(page.locator("#connection-status")).to_have_attribute(
        "data-state", "retrying", timeout=WAIT_MS
    )
    expect(page.locator("#banner")).to_contain_text("unreachable")
    with running_server(paced_engine(llama_checkpoint), port=port):
        connected(page)
        expect(page.locator("#banner")).to_be_hidden()
        set_params(page, max_tokens=8)
        send(page, "Are you back?")
        expect(last_reply(page)).to_have_attribute("data-state", "done", timeout=WAIT_MS)


INJECTION = (
    '<img src=x onerror="window.pwned=1"> <script>window.pwned=2</script>\n'
    "**bold <b>tag</b>** and `<i>code</i>` [click](javascript:window.pwned=3)\n\n"
    "```html\n<iframe src=javascript:window.pwned=4></iframe>\n```\n"
    "- item <svg onload=window.pwned=5>\n"
)


def test_markdown_renders_markup_in_model_output_as_text(server, open_page):
    page = open_page(base_url(server))
    rendered = page.evaluate(
        """async (source) => {
            const { renderMarkdown } = await import('/js/markdown.js');
            const host = document.createElement('div');
            host.append(renderMarkdown(source));
            document.body.append(host);
            await new Promise((resolve) => setTimeout(resolve, 100));
            return {
                text: host.textContent,
                tags: [...host.querySelectorAll('*')].map((node) => node.tagName.toLowerCase()),
                links: [...host.querySelectorAll('a')].map((a) => a.href),
                code: host.querySelector('pre code').textContent,
                pwned: window.pwned ?? null,
            };
        }""",
        INJECTION,
    )
    assert rendered["pwned"] is None
    assert not {"img", "script", "b", "i", "iframe", "svg"} & set(rendered["tags"])
    assert {"p", "strong", "code", "pre", "ul", "li"} <= set(rendered["tags"])
    assert rendered["links"] == []
    assert '<img src=x onerror="window.pwned=1">' in rendered["text"]
    assert "<script>window.pwned=2</script>" in rendered["text"]
    assert rendered["code"] == "<iframe src=javascript:window.pwned=4></iframe>"


def test_markdown_formats_what_chat_models_write(server, open_page):
    page = open_page(base_url(server))
    html = page.evaluate(
        """async (source) => {
            const { renderMarkdown } = await import('/js/markdown.js');
            const host = document.createElement('div');
            host.append(renderMarkdown(source));
            return host.innerHTML;
        }""",
        "# Title\nUse *care* with snake_case_names and __init__.\n\n"
        "1. one\n2. two\n   - nested\n\n[docs](https://example.org/a?b=1)\n\n"
        "```py\nprint('hi')",
    )
    assert "<h3>Title</h3>" in html
    assert "<em>care</em> with snake_case_names and <strong>init</strong>." in html
    assert "<ol><li>one</li><li>two<ul><li>nested</li></ul></li></ol>" in html
    assert (
        'href="https://example.org/a?b=1"' in html and 'rel="noopener noreferrer nofollow"' in html
    )
    # A code block still open mid-stream renders as code already.
    assert "<code data-language=\"py\">print('hi')</code>" in html


STORED_CONVERSATION = {
    "id": "evil",
    "title": "<img src=x onerror=window.pwned=1>",
    "created": 1,
    "updated": 1,
    "messages": [
        {"id": "u", "role": "user", "content": "<script>window.pwned=2</script>"},
        {
            "id": "a",
            "role": "assistant",
            "content": INJECTION,
            "finish": "stop",
            "usage": {"prompt_tokens": 12, "completion_tokens": 40},
            "timing": {
                "queue_ms": 0.4,
                "ttft_ms": 21.5,
                "tpot_ms": 9.8,
                "e2e_ms": 400,
                "cached_prompt_tokens": 0,
                "preemptions": 0,
            },
        },
    ],
}


def test_stored_conversation_with_markup_is_shown_as_text(server, open_page, browser):
    context = browser.new_context(viewport={"width": 1200, "height": 800}, color_scheme="dark")
    try:
        # Written before the page's scripts run, as if an earlier session had stored it.
        stored = json.dumps(json.dumps(STORED_CONVERSATION))
        context.add_init_script(f"localStorage.setItem('baton.conversation.evil', {stored});")
        page = open_page(base_url(server), context=context)
        connected(page)
        messages = page.locator("#messages")
        expect(messages).to_contain_text("<script>window.pwned=2</script>")
        expect(messages).to_contain_text('<img src=x onerror="window.pwned=1">')
        assert page.locator("#messages img, #messages script, #sidebar img").count() == 0
        assert page.evaluate("window.pwned ?? null") is None
        screenshot(page, "chat-dark-desktop")
        # Copy puts the reply's markdown source on the clipboard, as text.
        context.grant_permissions(["clipboard-read", "clipboard-write"])
        last_reply(page).get_by_role("button", name="Copy", exact=True).click()
        expect(last_reply(page).get_by_role("button", name="Copied")).to_be_visible()
        assert page.evaluate("navigator.clipboard.readText()") == INJECTION
    finally:
        context.close()


def test_reply_cut_off_by_a_closed_tab_shows_as_interrupted(server, open_page):
    page = connected(open_page(base_url(server)))
    set_params(page, max_tokens=LONG_REPLY)
    send(page, "A reply that never ends")
    expect(last_reply(page).locator(".message-content")).not_to_be_empty(timeout=WAIT_MS)
    page.reload()
    reply = last_reply(page)
    expect(reply).to_have_attribute("data-state", "error")
    expect(reply.locator(".message-error")).to_have_text(
        "The reply was interrupted before it finished."
    )
    expect(reply.get_by_role("button", name="Regenerate")).to_be_visible()


def test_chat_fits_a_phone_screen(server, open_page):
    page = connected(
        open_page(base_url(server), viewport={"width": 390, "height": 844}, color_scheme="dark")
    )
    set_params(page, max_tokens=24)
    send(page, "Hi from a phone")
    expect(last_reply(page)).to_have_attribute("data-state", "done", timeout=WAIT_MS)
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 390, f"the page scrolls sideways: {width}px wide"
    expect(page.locator("#sidebar")).not_to_be_in_viewport()
    page.click("#toggle-sidebar")
    expect(page.locator("#toggle-sidebar")).to_have_attribute("aria-expanded", "true")
    expect(page.locator("#new-chat")).to_be_in_viewport()
    page.keyboard.press("Escape")
    screenshot(page, "chat-dark-phone")
    page.click("#toggle-settings")
    screenshot(page, "chat-settings-dark-phone")


def test_theme_follows_the_system_until_chosen(server, open_page):
    page = open_page(base_url(server), color_scheme="dark")
    html, toggle = page.locator("html"), page.locator("#theme-toggle")
    expect(html).to_have_attribute("data-theme", "dark")
    expect(toggle).to_have_attribute("aria-pressed", "true")
    dark_background = page.evaluate("getComputedStyle(document.body).backgroundColor")
    page.emulate_media(color_scheme="light")
    expect(html).to_have_attribute("data-theme", "light")
    expect(toggle).to_have_attribute("aria-pressed", "false")
    assert page.evaluate("getComputedStyle(document.body).backgroundColor") != dark_background
    # Once chosen, the choice stays whatever the system does.
    toggle.click()
    page.emulate_media(color_scheme="light")
    page.emulate_media(color_scheme="dark")
    page.emulate_media(color_scheme="light")
    expect(html).to_have_attribute("data-theme", "dark")


def test_theme_toggle_switches_and_is_remembered(server, open_page):
    page = open_page(base_url(server), color_scheme="light")
    toggle = page.locator("#theme-toggle")
    expect(toggle).to_have_attribute("aria-pressed", "false")
    background = page.evaluate("getComputedStyle(document.body).backgroundColor")
    toggle.click()
    expect(toggle).to_have_attribute("aria-pressed", "true")
    page.reload()
    expect(page.locator("html")).to_have_attribute("data-theme", "dark")
    assert page.evaluate("getComputedStyle(document.body).backgroundColor") != background


def test_a_conversation_past_the_context_leaves_out_its_oldest_turns(llama_checkpoint, open_page):
    # A 160-token context: two exchanges of ~50-token messages and 30-token replies overflow it.
    engine = paced_engine(llama_checkpoint, max_model_len=160)
    with running_server(engine, model_name="tiny-ui") as state:
        page, frames = page_recording_sent_frames(open_page, base_url(state))
        set_params(page, max_tokens=30)
        turns = [f"turn {i}: " + "the quick brown fox jumps " * 2 for i in range(4)]
        for turn in turns:
            send(page, turn)
            expect(last_reply(page)).to_have_attribute("data-state", "done", timeout=WAIT_MS)

        sent = [f["messages"] for f in frames if f.get("type") == "generate"]
        first_users = [m[0]["content"] for m in sent]
        # The first requests carry the whole conversation; once it no longer fits, the oldest
        # turns are left out (never the newest message), and stay out for the next request.
        assert first_users[0] == turns[0]
        assert sent[-1][-1] == {"role": "user", "content": turns[-1]}
        assert turns[0] not in [m["content"] for m in sent[-1]]
        note = last_reply(page).locator(".context-note")
        expect(note).to_have_text(re.compile(r"^\d+ earlier messages left out"))
        expect(page.locator(".message-error")).to_have_count(0)
        screenshot(page, "context-trimmed")
