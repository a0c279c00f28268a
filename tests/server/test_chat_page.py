"""The chat page (``GET /``) in a real browser: Debian's chromium, headless, driven by Playwright, against SmolLM2
served in-process with an API key. A greedy reply streams in and equals Engine.generate's, the model's name is
shown, the second turn sends both turns, the user's text is text (never HTML), nothing is fetched from elsewhere,
and a wrong key, Stop and New chat behave. A reply is Markdown, rendered while it streams (code in monospace
blocks, lists), with the HTML it holds shown as text and nothing of it run; the page fits a phone's width.
Skipped without /usr/bin/chromium (``.ci/run`` installs it with apt; ``playwright install`` downloads a browser
from the internet and is never used)."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from model_files import SMOLLM2
from test_server import HANG_TIMEOUT, Server, serving

from kleidipy.runtime.generate import Engine
from kleidipy.runtime.sampler import SamplingParams
from kleidipy.server.inside import LoadRecord

CHROMIUM = Path("/usr/bin/chromium")
if not CHROMIUM.exists():
    pytest.skip(
        f"{CHROMIUM} is missing: the chat page is tested in Debian's chromium (apt-get install chromium)",
        allow_module_level=True,
    )
playwright = pytest.importorskip("playwright.sync_api", reason="playwright is missing: pip install -e '.[dev]'")

ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip
KEY = "s3cret"
QUESTION = "What is the capital of France?\nAnswer in one sentence."
MAX_TOKENS = 8
WAIT_MS = HANG_TIMEOUT * 1000  # only catches a hang


@pytest.fixture(scope="module")
def greedy(smollm2: Engine) -> str:
    """Engine.generate's reply to QUESTION (temperature 0, MAX_TOKENS): run before the scheduler takes the model."""
    prompt = smollm2.chat_prompt([{"role": "user", "content": QUESTION}])
    return "".join(smollm2.generate(prompt, MAX_TOKENS, SamplingParams(temperature=0.0)))


@pytest.fixture(scope="module")
def server(greedy: str) -> Iterator[Server]:
    """SmolLM2 served as ``kleidipy serve`` serves it: its load recorded for the Inside view."""
    load = LoadRecord()
    engine = Engine(SMOLLM2, n_ctx=1024, progress=False, observers=[load])
    engine.observers.remove(load)
    with serving(engine, parallel=1, api_key=KEY, load=load) as server:
        yield server


@pytest.fixture(scope="module")
def browser() -> Iterator[playwright.Browser]:
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser: playwright.Browser, server: Server) -> Iterator[playwright.Page]:
    context = browser.new_context()
    page = context.new_page()
    page.set_default_timeout(30_000)
    page.goto(f"http://127.0.0.1:{server.port}/")
    yield page
    context.close()


def wait_turns(page: playwright.Page, n: int) -> None:
    """Wait until the page's conversation holds ``n`` messages (the reply is finished and recorded)."""
    page.wait_for_function("n => messages.length === n", arg=n, timeout=WAIT_MS)


def test_chat_streams_the_reply_and_sends_the_whole_conversation(
    page: playwright.Page, server: Server, greedy: str
) -> None:
    origin = f"http://127.0.0.1:{server.port}"
    requests, csp_errors = [], []
    page.on("request", lambda r: requests.append(r))
    page.on("console", lambda m: csp_errors.extend([m.text] if "Content Security Policy" in m.text else []))
    page.click("#settings summary")
    page.fill("#key", KEY)
    page.dispatch_event("#key", "change")  # the model's name is fetched again with the key
    playwright.expect(page.locator("#model")).to_have_text(f"model: {SMOLLM2}", timeout=WAIT_MS)
    page.fill("#max-tokens", str(MAX_TOKENS))
    page.fill("#temperature", "0")
    box = page.locator("#input")
    first, second = QUESTION.split("\n")
    box.press_sequentially(first)
    box.press("Shift+Enter")  # a new line, not a send
    box.press_sequentially(second)
    assert box.input_value() == QUESTION
    box.press("Enter")
    wait_turns(page, 2)
    replies = page.locator(".msg.assistant")
    assert replies.count() == 1 and replies.nth(0).text_content() == greedy != ""
    assert box.input_value() == ""

    follow_up = "And of <b>Germany</b>?"
    box.fill(follow_up)
    box.press("Enter")
    wait_turns(page, 4)
    assert page.locator(".msg.user").nth(1).text_content() == follow_up
    assert page.locator("#log b").count() == 0  # text is text, never markup
    second_reply = replies.nth(1).text_content()
    assert second_reply

    posts = [r for r in requests if r.method == "POST" and r.url == f"{origin}/v1/chat/completions"]
    assert len(posts) == 2
    assert all(r.headers["authorization"] == f"Bearer {KEY}" for r in posts)
    bodies = [r.post_data_json for r in posts]
    assert all(b["stream"] is True and b["max_tokens"] == MAX_TOKENS and b["temperature"] == 0 for b in bodies)
    assert bodies[0]["messages"] == [{"role": "user", "content": QUESTION}]
    assert bodies[1]["messages"] == [
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": greedy},
        {"role": "user", "content": follow_up},
    ]
    assert page.evaluate("messages")[3] == {"role": "assistant", "content": second_reply}
    assert all(r.url.startswith(origin + "/") for r in requests if not r.url.startswith("data:"))
    assert not csp_errors

    page.click("#new")
    assert page.locator("#log .msg").count() == 0 and page.evaluate("messages.length") == 0


def test_a_wrong_key_is_shown_and_stop_ends_the_reply(
    page: playwright.Page, server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    playwright.expect(page.locator("#model")).to_contain_text("invalid API key", timeout=WAIT_MS)
    page.click("#settings summary")
    page.fill("#key", "wrong")
    box = page.locator("#input")
    box.fill("Count from 1 to 200.")
    box.press("Enter")
    playwright.expect(page.locator("#error")).to_contain_text("Error: invalid API key", timeout=WAIT_MS)
    assert box.input_value() == "Count from 1 to 200."  # the turn is taken back, to send again
    assert page.locator("#log .msg").count() == 0 and page.evaluate("messages.length") == 0

    # the reply is held after a few tokens until Stop is clicked: however fast the model and however slow the
    # browser, Stop is clicked while the reply runs (121 greedy tokens took under a second; CI once missed it)
    scheduler, released = server.app.state.scheduler, threading.Event()
    forward, passes = scheduler._forward, itertools.count()

    def held_forward(parts: list) -> list:
        if next(passes) >= 4:
            released.wait(HANG_TIMEOUT)
        return forward(parts)

    monkeypatch.setattr(scheduler, "_forward", held_forward)
    page.fill("#key", KEY)
    page.fill("#temperature", "0")
    page.click("#send")
    playwright.expect(page.locator(".msg.assistant")).not_to_have_text("", timeout=WAIT_MS)
    page.click("#stop")
    released.set()
    wait_turns(page, 2)
    playwright.expect(page.locator(".msg.note")).to_have_text("(stopped)")
    assert page.locator("#error").text_content() == ""
    deadline = time.monotonic() + HANG_TIMEOUT
    while server.request("GET", "/health", headers={"Authorization": f"Bearer {KEY}"})[1]["slots_processing"]:
        assert time.monotonic() < deadline, "the aborted stream did not free its slot"
        time.sleep(0.05)


#: a reply in Markdown, as the model is made to write it token by token: a fenced code block, a list, raw HTML
#: (shown as the text it is, never run), a javascript: link (dropped) and an image (a link: nothing is fetched)
MARKDOWN_REPLY = (
    "Here is the code:\n\n```python\nfor i in range(3):\n    print(i, '<b>not bold</b>')\n```\n\n"
    "- one\n- **two**\n\n"
    "<img src=x onerror=\"window.pwned = 'img'\"> <script>window.pwned = 'script'</script>\n\n"
    "[click](javascript:window.pwned='link') and ![logo](https://example.com/logo.png)"
)


def scripted_forward(scheduler: object, tokens: list[int], hold_at: int, held: threading.Event) -> object:
    """The scheduler's forward pass (the KV cache is filled as usual) with the logits replaced so that the greedy
    reply is ``tokens``: pass i picks tokens[i]; pass ``hold_at`` waits for ``held`` (the page shows the reply
    so far meanwhile)."""
    forward, passes = scheduler._forward, itertools.count()

    def scripted(parts: list) -> list:
        i = next(passes)
        if i == hold_at:
            held.wait(HANG_TIMEOUT)
        logits = forward(parts)
        picked = np.full_like(logits[0], -1e4)
        picked[tokens[min(i, len(tokens) - 1)]] = 1e4
        return [picked]

    return scripted


def test_a_reply_is_markdown_rendered_as_it_streams_and_sanitized(
    page: playwright.Page, server: Server, smollm2: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    tok = smollm2.tokenizer
    tokens = tok.encode(MARKDOWN_REPLY, add_special=False)
    assert tok.decode(tokens) == MARKDOWN_REPLY
    tokens.append(min(tok.eog_ids))
    # hold the reply inside its code block, the closing fence not yet sent
    hold_at = next(k for k in range(len(tokens)) if "print" in tok.decode(tokens[:k]))
    scheduler, released = server.app.state.scheduler, threading.Event()
    monkeypatch.setattr(scheduler, "_forward", scripted_forward(scheduler, tokens, hold_at, released))
    console = []
    page.on("console", lambda m: console.append(m.text))
    requests = []
    page.on("request", lambda r: requests.append(r.url))
    page.click("#settings summary")
    page.fill("#key", KEY)
    page.fill("#temperature", "0")
    page.fill("#input", "Show me some Markdown.")
    page.press("#input", "Enter")

    reply = page.locator(".msg.assistant")
    code = reply.locator("pre > code")
    try:  # mid-stream: the open fence is already a code block
        playwright.expect(code).to_contain_text("print", timeout=WAIT_MS)
        assert page.evaluate("messages.length") == 0
    finally:
        released.set()
    wait_turns(page, 2)
    assert page.evaluate("messages[1].content") == MARKDOWN_REPLY  # the conversation keeps the Markdown
    assert code.text_content() == "for i in range(3):\n    print(i, '<b>not bold</b>')\n"
    font = code.evaluate("e => getComputedStyle(e).fontFamily")
    assert "monospace" in font and "monospace" not in reply.locator("p").first.evaluate(
        "e => getComputedStyle(e).fontFamily"
    )
    assert reply.locator("ul > li").all_text_contents() == ["one", "two"]
    assert reply.locator("ul > li strong").text_content() == "two"
    # nothing of the HTML in the reply is an element or ran: it reads as text
    assert page.locator("#log img, #log script, #log b").count() == 0
    assert page.evaluate("window.pwned") is None
    assert "<img src=x onerror=\"window.pwned = 'img'\">" in reply.text_content()
    assert "<script>window.pwned = 'script'</script>" in reply.text_content()
    links = reply.locator("a")
    assert links.count() == 2 and links.nth(0).get_attribute("href") is None  # javascript: dropped
    assert links.nth(1).get_attribute("href") == "https://example.com/logo.png"
    assert links.nth(1).get_attribute("target") == "_blank"
    links.nth(0).click()
    assert page.evaluate("window.pwned") is None
    origin = f"http://127.0.0.1:{server.port}/"
    assert all(url.startswith(origin) for url in requests), requests
    assert not [m for m in console if "Content Security Policy" in m]


PHONE = {"width": 380, "height": 740}


def test_the_page_fits_a_phone(browser: playwright.Browser, server: Server) -> None:
    """At 380 px nothing makes the page wider than the screen: a long code line and a wide table scroll inside
    the reply, the message box and its buttons stay on screen."""
    context = browser.new_context(viewport=PHONE, is_mobile=True, has_touch=True)
    try:
        page = context.new_page()
        page.goto(f"http://127.0.0.1:{server.port}/")
        wide = (
            "A paragraph with a_very_long_identifier_that_does_not_fit_on_a_phone_screen_at_all_" * 2 + "\n\n"
            "```\n" + "x = " + "1 + " * 60 + "1\n```\n\n"
            "| " + " | ".join(f"column {i}" for i in range(12)) + " |\n|" + "---|" * 12 + "\n"
            "| " + " | ".join(f"cell {i}" for i in range(12)) + " |\n"
        )
        page.evaluate("text => { bubble('user', text); renderReply(bubble('assistant', ''), text); }", wide)
        assert page.locator(".msg.assistant table td").count() == 12
        assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
        for selector in ("pre", "table"):
            box = page.locator(f".msg.assistant {selector}").bounding_box()
            assert box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"], selector
            assert page.locator(f".msg.assistant {selector}").evaluate("e => e.scrollWidth > e.clientWidth")
        for selector in ("#input", "#send", "#stop", "#new", "#settings summary"):
            box = page.locator(selector).bounding_box()
            assert box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"], selector
    finally:
        context.close()


def test_the_inside_view_shows_the_kernels_the_packing_and_the_mopa_loop(
    browser: playwright.Browser, server: Server, tmp_path: Path
) -> None:
    """After one chat message the Inside view shows the repack, prefill and decode kernels with their times, the
    packing picture zooms to readable labels, and the MOPA inner loop steps forward and back (screenshots of each
    in ``tmp_path``)."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    try:
        page = context.new_page()
        page.set_default_timeout(30_000)
        errors = []
        page.on("console", lambda m: errors.extend([m.text] if m.type == "error" else []))
        page.goto(f"http://127.0.0.1:{server.port}/")
        page.click("#settings summary")
        page.fill("#key", KEY)
        page.fill("#max-tokens", "4")
        page.fill("#temperature", "0")
        page.fill("#input", "Hi!")
        page.press("#input", "Enter")
        wait_turns(page, 2)
        page.click("#inside-toggle")
        assert page.locator("#inside").is_visible() and page.locator("#log").is_visible()  # beside the chat
        for stage, role in (("load", "rhs_pack"), ("prefill", "gemm"), ("decode", "gemv")):
            rows = page.locator(f'section[data-stage="{stage}"] td:text-is("{role}")')
            playwright.expect(rows.first).to_be_visible(timeout=WAIT_MS)
        decode = page.locator('section[data-stage="decode"]')
        assert "kai_run_matmul_" in decode.text_content() and "kai_run_lhs_quant_pack_" in decode.text_content()
        times = decode.locator("tbody tr").first.locator("td").nth(3).text_content()
        assert float(times) > 0
        page.screenshot(path=tmp_path / "inside-stages.png")

        img = page.locator("#layout-img")
        page.wait_for_function("() => document.getElementById('layout-img').naturalWidth > 0", timeout=WAIT_MS)
        fit = float(img.get_attribute("data-scale"))
        for _ in range(6):
            page.click("#zoom-in")
        zoomed = float(img.get_attribute("data-scale"))
        # labels are 6 pt text (8 px) in the picture's own size: at 1.5x and more they read as 12 px
        assert zoomed > fit and zoomed >= 1.5
        assert (
            img.bounding_box()["width"] >= 1.5 * page.evaluate("document.getElementById('layout-img').naturalWidth") - 2
        )
        page.locator("#layout-view").screenshot(path=tmp_path / "inside-layout-zoomed.png")

        playwright.expect(page.locator("#mopa-pos")).to_contain_text("step 1 of", timeout=WAIT_MS)
        nonzero = lambda: int(page.locator("#mopa-za").get_attribute("data-nonzero"))  # noqa: E731
        texts, counts = [], []
        for _ in range(60):
            page.click("#mopa-step")
            texts.append(page.locator("#mopa-text").text_content())
            counts.append(nonzero())
        assert any("SMOPA" in t for t in texts) and max(counts) > 0, (texts, counts)
        at = page.locator("#mopa-pos").text_content()
        page.screenshot(path=tmp_path / "inside-mopa.png")
        page.click("#mopa-back")
        assert page.locator("#mopa-pos").text_content() != at and page.locator("#mopa-text").text_content() == texts[-2]
        assert nonzero() == counts[-2]
        page.click("#mopa-step")
        assert page.locator("#mopa-pos").text_content() == at and page.locator("#mopa-text").text_content() == texts[-1]
        assert nonzero() == counts[-1]
        assert not [e for e in errors if "Content Security Policy" in e or "Uncaught" in e], errors
    finally:
        context.close()
