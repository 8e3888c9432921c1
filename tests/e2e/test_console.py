"""The operator console at /ui in a real browser, every service its own process.

The browser is Debian's chromium, driven by playwright. The board follows pipelines live without a reload, a
pipeline's page shows its photos, stages, attempts, timeline and previews and retries and cancels through its
buttons, the stats page charts the window, the usage page counts a tenant's day and shows its budgets, the
dead-letter page replays and discards, a key sees only what its scopes allow. Each test fails on any console error
or uncaught exception of the page, and writes its screenshots (into var/console; `make screenshots` refreshes those
of docs/console).
"""

from __future__ import annotations

import datetime as dt
import json
import pathlib
import re
import uuid

import httpx
import pika
import pytest
from castad_api import keys, tables, usage
from castad_contracts import api, brief
from castad_local import access, demo_photos
from castad_local.fakes.chat import FakeChat, Reply
from castad_runtime import db
from castad_testkit import briefs
from playwright.sync_api import expect

from tests.e2e import browser as browser_
from tests.e2e.test_network_providers import with_chat

pytestmark = pytest.mark.e2e
WAIT_MS = 30_000  # the longest a state may take to show on the page
JAEGER = "http://127.0.0.1:16686/trace/{trace_id}"
HANGUL_FONTS = ("Noto Sans CJK", "NanumGothic", "Nanum Gothic")


@pytest.fixture
def chat():
    with FakeChat() as fake:
        yield fake


def row(console: browser_.Console, pipeline_id: str):
    return console.page.locator(f'tbody[data-testid="pipelines"] tr[data-pipeline-id="{pipeline_id}"]')


def count(console: browser_.Console, key: str):
    return console.page.locator(f'[data-count="{key}"] .n')


def rendering_fonts(console: browser_.Console, selector: str) -> list[str]:
    """The fonts chromium drew the text of the element with (DevTools' CSS.getPlatformFontsForNode)."""
    cdp = console.page.context.new_cdp_session(console.page)
    cdp.send("DOM.enable")
    cdp.send("CSS.enable")
    root = cdp.send("DOM.getDocument")["root"]["nodeId"]
    node = cdp.send("DOM.querySelector", {"nodeId": root, "selector": selector})["nodeId"]
    fonts = cdp.send("CSS.getPlatformFontsForNode", {"nodeId": node})["fonts"]
    return [font["familyName"] for font in fonts if font["glyphCount"]]


def texts_complete(console: browser_.Console) -> None:
    """Every text the pages asked for exists in both languages."""
    missing = console.page.evaluate(
        "async () => { const i18n = await import('./js/i18n.js');"
        " return [...i18n.untranslated(), ...i18n.unknownKeys]; }"
    )
    assert missing == []


def confirm(console: browser_.Console, reason: str | None = None) -> None:
    dialog = console.page.get_by_test_id("confirm-dialog")
    expect(dialog).to_be_visible()
    if reason is not None:
        dialog.get_by_test_id("confirm-reason").fill(reason)
    dialog.get_by_test_id("confirm").click()
    expect(dialog).to_have_count(0)


def media_ready(console: browser_.Console, selector: str) -> None:
    """The <audio> or <video> element loaded its file (from the blob the page downloaded with its key)."""
    element = console.page.locator(selector)
    expect(element).to_have_attribute("src", re.compile("^blob:"), timeout=WAIT_MS)
    console.page.wait_for_function(
        "(selector) => { const m = document.querySelector(selector);"
        " return m && m.readyState >= 1 && m.duration > 0; }",
        arg=selector,
        timeout=WAIT_MS,
    )


@pytest.mark.timeout(180)
def test_an_operator_watches_the_board_live_then_retries_a_failed_pipeline_and_cancels_a_running_one(
    castad, installation, chat: FakeChat, browser
):
    # The lyric stage asks a local Chat Completions server that refuses the first brief (a 400 fails the
    # stage at once), hangs on the second until it is canceled, and answers every later one.
    running = castad({**with_chat(chat), "CASTAD_API_TRACE_URL": JAEGER})
    console = browser_.console_page(browser, running.base_url)
    page = console.page

    console.open()
    expect(page.get_by_test_id("login")).to_be_visible()
    console.screenshot("login")
    console.allow("status of 401")  # the refused key below
    console.log_in("cad_not-a-key")
    expect(page.get_by_test_id("login-error")).not_to_be_empty()
    console.log_in(installation.api_key)
    expect(page.get_by_test_id("tenant")).to_have_text("tests")
    expect(page.get_by_test_id("live")).to_have_attribute("data-state", "open", timeout=WAIT_MS)
    page.evaluate("() => { window.notReloaded = true; }")  # gone if anything reloads the page
    failed_before = int(count(console, "status-FAILED").inner_text(timeout=WAIT_MS))

    chat.script(Reply("status", status=400), Reply("hang", seconds=120))
    shown = [running.client.upload_image(name, data).id for name, data in demo_photos.photos().items()][:2]
    with_photos = api.PipelineRequest(**briefs.sample("바다책방").model_dump(), photos=shown, formats=["9:16", "1:1"])
    refused = running.client.submit(with_photos).id
    expect(row(console, refused)).to_have_attribute("data-status", "FAILED", timeout=WAIT_MS)
    hanging = running.submit(
        brief.Brief(customer_name="Cafe Blue", region="Busan", language=brief.Language.ENGLISH, duration_s=3)
    )
    expect(row(console, hanging)).to_have_attribute("data-status", "RUNNING", timeout=WAIT_MS)
    succeeded = running.submit(briefs.sample("파도책방"))
    expect(row(console, succeeded)).to_have_attribute("data-status", "SUCCEEDED", timeout=WAIT_MS)
    expect(count(console, "status-FAILED")).to_have_text(str(failed_before + 1), timeout=WAIT_MS)
    expect(row(console, refused)).to_contain_text("바다책방")
    expect(count(console, "lyric-running")).to_have_text("1", timeout=WAIT_MS)
    assert page.evaluate("() => window.notReloaded") is True
    fonts = rendering_fonts(console, f'tr[data-pipeline-id="{refused}"] a.customer')
    assert any(font.startswith(HANGUL_FONTS) for font in fonts), fonts
    console.screenshot("board")

    # Search by a part of a customer's name, then by a status.
    page.get_by_test_id("search").fill("파도")
    page.get_by_test_id("search").press("Enter")
    expect(page.locator('tbody[data-testid="pipelines"] tr[data-pipeline-id]')).to_have_count(1, timeout=WAIT_MS)
    expect(row(console, succeeded)).to_be_visible()
    page.get_by_test_id("search").fill("")
    page.get_by_test_id("filter-status").select_option("FAILED")
    expect(page.locator('tbody[data-testid="pipelines"] tr[data-pipeline-id]')).to_have_count(1, timeout=WAIT_MS)
    expect(row(console, refused)).to_be_visible()

    # The refused pipeline: its failed lyric attempt, then a retry through the button, followed live.
    row(console, refused).locator("a.customer").click()
    expect(page.get_by_test_id("pipeline-status")).to_have_attribute("data-status", "FAILED")
    expect(page.locator('.stage-card[data-stage="lyric"]')).to_contain_text("provider_rejected")
    expect(page.locator('tbody[data-testid="attempts"] tr[data-outcome="failed"]')).to_have_count(1)
    expect(page.get_by_test_id("cancel")).to_have_count(0)
    page.get_by_test_id("retry").click()
    confirm(console)
    expect(page.get_by_test_id("action-result")).to_contain_text("Retry accepted: resumes at Lyrics")
    expect(page.get_by_test_id("pipeline-status")).to_have_attribute("data-status", "SUCCEEDED", timeout=WAIT_MS)
    expect(page.locator('tbody[data-testid="timeline"] tr[data-status="retry_requested"]')).to_contain_text(
        "e2e-operator"
    )
    expect(page.get_by_test_id("lyrics")).to_contain_text("바다책방", timeout=WAIT_MS)
    # The brief's photos as thumbnails, in its order, each fetched with the key and drawn.
    photos = page.get_by_test_id("photo")
    expect(photos).to_have_count(2, timeout=WAIT_MS)
    assert [photos.nth(i).get_attribute("data-image-id") for i in range(2)] == shown
    page.wait_for_function(
        "() => [...document.querySelectorAll('[data-testid=photo]')]"
        f".every((img) => img.complete && img.src.startsWith('blob:') && img.naturalWidth === {demo_photos.SIZE[0]})",
        timeout=WAIT_MS,
    )
    media_ready(console, "[data-testid=song]")
    for shape in ("9:16", "1:1"):  # a player for each format the brief asked for
        media_ready(console, f'[data-testid=video][data-format="{shape}"]')
    # The song's caption files, saved through the page with its key.
    with page.expect_download() as saving:
        page.locator('[data-download="captions.vtt"]').click()
    assert saving.value.suggested_filename == f"{refused}-song.vtt"
    assert pathlib.Path(saving.value.path()).read_text(encoding="utf-8").startswith("WEBVTT")
    expect(page.locator('[data-download="captions.srt"]')).to_have_count(1)
    # Each format's poster: on its player, fetched with the key; the video's own and each format's saved.
    for shape in ("9:16", "1:1"):
        player = page.locator(f'[data-testid=video][data-format="{shape}"]')
        expect(player).to_have_attribute("poster", re.compile(r"^blob:"))
    with page.expect_download() as saving:
        page.locator('[data-download="poster"]').click()
    assert saving.value.suggested_filename == f"{refused}-poster.jpg"
    with page.expect_download() as saving:
        page.locator('[data-download="format.1:1"]').click()
    assert saving.value.suggested_filename == f"{refused}-video-1x1.mp4"
    expect(page.locator('[data-download="format.1:1.poster"]')).to_have_count(1)
    trace_url = running.http.get(f"/v1/pipelines/{refused}/timeline").json()["trace_url"]
    expect(page.get_by_test_id("trace")).to_have_attribute("href", trace_url)
    assert page.evaluate("() => window.notReloaded") is True
    # Its stream closed with its end: said so, not shown as a connection being lost.
    expect(page.get_by_test_id("live")).to_have_attribute("data-state", "ended", timeout=WAIT_MS)
    console.screenshot("pipeline")

    # The hanging pipeline: canceled through the button while its lyric call runs.
    page.get_by_test_id("nav-board").click()
    row(console, hanging).locator("a.customer").click()
    expect(page.get_by_test_id("pipeline-status")).to_have_attribute("data-status", "RUNNING")
    expect(page.get_by_test_id("retry")).to_have_count(0)
    page.get_by_test_id("cancel").click()
    confirm(console, reason="wrong brief")
    expect(page.get_by_test_id("pipeline-status")).to_have_attribute("data-status", "CANCELED", timeout=WAIT_MS)
    expect(page.locator('.stage-card[data-stage="lyric"]')).to_have_attribute("data-status", "CANCELED")
    expect(page.locator(".pipeline-head")).to_contain_text("wrong brief")
    assert running.client.status(hanging).cancel_reason == "wrong brief"

    # The same board in Korean: the layout holds both languages.
    page.get_by_test_id("nav-board").click()
    page.get_by_test_id("language").select_option("ko")
    expect(page.locator("h1")).to_have_text("현황판")
    expect(row(console, refused)).to_have_attribute("data-status", "SUCCEEDED", timeout=WAIT_MS)
    expect(row(console, hanging)).to_have_attribute("data-status", "CANCELED")
    console.screenshot("board-ko")
    texts_complete(console)
    assert console.errors == []


def poison(broker, body: bytes) -> None:
    """A message straight into the lyric stage's queue, as a broken producer would send it."""
    properties = pika.BasicProperties(delivery_mode=2, message_id=str(uuid.uuid4()))
    broker.channel.basic_publish("", broker.topology.queue("lyric"), body, properties, mandatory=True)


@pytest.mark.timeout(150)
def test_the_stats_page_charts_the_window_and_dead_letters_are_replayed_and_discarded_after_a_confirmation(
    castad, installation, broker, browser
):
    running = castad()
    ids = [running.submit(briefs.sample(name)) for name in ("바다책방", "파도책방", "물결책방")]
    running.wait_terminal(ids)
    event = {
        "specversion": "1.0",
        "id": str(uuid.uuid4()),
        "source": "/castad/console-test",
        "type": "console.exploded",  # no service handles it
        "subject": ids[0],
        "time": dt.datetime.now(dt.UTC).isoformat(),  # recent enough to be replayed
        "datacontenttype": "application/json",
        "schemaversion": 1,
        "data": {"from": "the console test"},
    }
    poison(broker, json.dumps(event).encode())
    poison(broker, b"\x00\xff not json at all")

    def recorded():
        items = running.http.get("/v1/dead-letters").json()["items"]
        return {item["event_type"]: item for item in items} if len(items) == 2 else None

    letters = running.wait_until("both dead letters recorded", recorded)
    unknown, garbage = letters["console.exploded"], letters[None]

    console = browser_.console_page(browser, running.base_url)
    page = console.page
    console.open()
    console.log_in(installation.api_key)
    page.get_by_test_id("nav-stats").click()
    expect(page.locator('[data-count="created"] .n')).to_have_text("3", timeout=WAIT_MS)
    expect(page.locator('[data-count="status-SUCCEEDED"] .n')).to_have_text("3")
    expect(page.locator('[data-count="dead-letters"] .n')).to_have_text("2")
    expect(page.locator('figure[data-chart="throughput"] polyline')).to_have_count(4)
    expect(page.locator('figure[data-chart="failure-rate"] rect.bar')).to_have_count(3)
    expect(page.locator('figure[data-chart="durations"] rect.bar')).to_have_count(9)
    video = page.locator('table[data-testid="stage-stats"] tr[data-stage="video"] td')
    expect(video.nth(5)).to_have_text("3")  # succeeded
    page.locator('button[data-window="15m"]').click()
    expect(page).to_have_url(re.compile(r"#/stats\?window=15m$"))
    expect(page.locator('button[data-window="15m"]')).to_have_attribute("aria-pressed", "true")
    expect(page.locator('[data-count="created"] .n')).to_have_text("3", timeout=WAIT_MS)
    console.screenshot("stats")

    page.get_by_test_id("nav-dead-letters").click()
    expect(page.locator('tbody[data-testid="dead-letters"] tr[data-letter-id]')).to_have_count(2, timeout=WAIT_MS)
    console.screenshot("dead-letters")

    # The event of an unknown type: replayed, after a confirmation.
    page.locator(f'tr[data-letter-id="{unknown["id"]}"] a').first.click()
    expect(page.get_by_test_id("letter-reason")).to_have_text(unknown["reason"])
    expect(page.get_by_test_id("letter-body")).to_contain_text("console.exploded")
    page.get_by_test_id("replay").click()
    confirm(console)
    expect(page.get_by_test_id("letter-status")).to_have_attribute("data-status", "replayed", timeout=WAIT_MS)
    expect(page.get_by_test_id("action-result")).to_contain_text(f"sent back to {unknown['queue']}")
    expect(page.get_by_test_id("letter-actions")).to_contain_text("e2e-operator")
    console.screenshot("dead-letter")

    # The undecodable one: a discard needs a reason.
    page.goto(f"{running.base_url}/ui/#/dead-letters/{garbage['id']}")
    expect(page.get_by_test_id("letter-status")).to_have_attribute("data-status", "dead", timeout=WAIT_MS)
    page.get_by_test_id("discard").click()
    expect(page.get_by_test_id("confirm")).to_be_disabled()
    confirm(console, reason="garbage from a test")
    expect(page.get_by_test_id("letter-status")).to_have_attribute("data-status", "discarded", timeout=WAIT_MS)
    expect(page.get_by_test_id("replay")).to_have_count(0)
    expect(page.get_by_test_id("discard")).to_have_count(0)
    shown = running.http.get(f"/v1/dead-letters/{garbage['id']}").json()
    assert (shown["status"], shown["actions"][-1]["detail"]) == ("discarded", "garbage from a test")
    texts_complete(console)
    assert console.errors == []


@pytest.mark.timeout(120)
def test_a_key_sees_only_what_its_scopes_allow_and_a_revoked_key_goes_back_to_the_login(shared, browser):
    running, installation, dbs = shared, shared.installation, shared.dbs
    running.faults("lyric", permanent_rate=1)
    pipeline_id = running.submit(briefs.sample())
    assert running.wait_terminal([pipeline_id])[pipeline_id].status == "FAILED"

    # The page needs no key and is no part of the API's document; it comes with a strict policy.
    with httpx.Client(base_url=running.base_url, timeout=10) as anonymous:
        assert anonymous.get("/ui").headers["location"].endswith("/ui/")
        shell = anonymous.get("/ui/")
        module = anonymous.get("/ui/js/main.js")
        paths = anonymous.get("/openapi.json").json()["paths"]
    assert shell.status_code == 200 and shell.headers["content-type"].startswith("text/html")
    policy = shell.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "default-src 'none'" in policy and "unsafe" not in policy
    assert module.status_code == 200 and "javascript" in module.headers["content-type"]
    assert not [path for path in paths if path.startswith("/ui")]

    reader = access.create_key(shared.tenant, frozenset({keys.Scope.READ}), "console reader", installation.env())
    me = httpx.get(f"{running.base_url}/v1/me", headers={"Authorization": f"Bearer {reader}"}).json()
    assert (me["tenant"], me["name"], me["scopes"]) == (shared.tenant, "console reader", ["read"])
    console = browser_.console_page(browser, running.base_url)
    page = console.page
    console.open()
    console.log_in(reader)
    expect(page.get_by_test_id("scopes")).to_have_text("read")
    expect(page.get_by_test_id("nav-stats")).to_have_count(0)
    expect(page.get_by_test_id("nav-dead-letters")).to_have_count(0)
    expect(page.locator('[data-count="status-FAILED"] .n')).to_have_text("1", timeout=WAIT_MS)  # from the list
    row(console, pipeline_id).locator("a.customer").click()
    expect(page.get_by_test_id("pipeline-status")).to_have_attribute("data-status", "FAILED", timeout=WAIT_MS)
    expect(page.get_by_test_id("retry")).to_have_count(0)  # FAILED, but the key may not operate
    page.goto(f"{running.base_url}/ui/#/stats")
    expect(page.get_by_test_id("not-allowed")).to_be_visible()
    # The key stays in this tab's sessionStorage: never in a cookie or a URL.
    assert page.context.cookies() == [] and reader not in page.url
    assert page.evaluate("() => sessionStorage.getItem('castad.key')") == reader

    [key_id] = [r["id"] for r in dbs.rows("api", tables.api_keys.select()) if r["shown"] == reader[:12]]
    assert access.revoke_key(key_id, installation.env())
    console.allow("status of 401")
    # The board asks the gateway with the revoked key. (Not a click on the header's link: a request of the
    # console's own may meet the revocation first and take the page back to the login, links and all.)
    page.goto(f"{running.base_url}/ui/#/board")
    expect(page.get_by_test_id("login")).to_be_visible(timeout=WAIT_MS)
    expect(page.get_by_test_id("login-error")).to_contain_text("log in again")
    assert page.evaluate("() => sessionStorage.getItem('castad.key')") is None
    assert console.errors == []


@pytest.mark.timeout(90)
def test_the_brand_page_sets_the_kit_with_a_new_logo_changes_it_and_removes_it_a_reader_only_sees_it(
    shared, browser, tmp_path
):
    running, installation = shared, shared.installation
    marketer = access.create_key(
        shared.tenant, frozenset({keys.Scope.SUBMIT, keys.Scope.READ}), "marketer", installation.env()
    )
    reader = access.create_key(shared.tenant, frozenset({keys.Scope.READ}), "brand reader", installation.env())
    logo = tmp_path / "logo.jpg"
    logo.write_bytes(demo_photos.photos()["sea-at-dusk.jpg"])
    console = browser_.console_page(browser, running.base_url)
    page = console.page
    console.allow("status of 404")  # GET /v1/brand before a kit is set, and after it is removed
    console.open()
    console.log_in(marketer)
    page.get_by_test_id("nav-brand").click()
    expect(page.get_by_test_id("no-brand")).to_be_visible(timeout=WAIT_MS)

    page.get_by_test_id("brand-main").fill("#1e90ff")
    page.get_by_test_id("brand-accent").fill("#ffd700")
    page.get_by_test_id("brand-font-choice").select_option("Noto Serif CJK")
    page.get_by_test_id("brand-position").select_option("bottom")
    page.get_by_test_id("brand-logo-file").set_input_files(str(logo))
    page.get_by_test_id("brand-save").click()

    expect(page.get_by_test_id("brand-result")).to_contain_text("Saved", timeout=WAIT_MS)
    expect(page.locator("[data-testid=brand-colors] .swatch")).to_have_count(2)
    expect(page.get_by_test_id("brand-font")).to_have_text("Noto Serif CJK")
    page.wait_for_function(
        "() => { const img = document.querySelector('[data-testid=brand-logo]'); return img && img.naturalWidth > 0; }",
        timeout=WAIT_MS,
    )
    headers = {"Authorization": f"Bearer {marketer}"}
    kit = httpx.get(f"{running.base_url}/v1/brand", headers=headers).json()
    assert (kit["colors"], kit["font"], kit["caption_style"]) == (
        ["#1e90ff", "#ffd700"],
        "Noto Serif CJK",
        {"position": "bottom", "size": "medium"},
    )
    assert kit["logo"] is not None
    console.screenshot("brand")

    # Changed without a new logo: the one it had is kept; then removed.
    page.get_by_test_id("brand-size").select_option("large")
    page.get_by_test_id("brand-save").click()
    expect(page.get_by_test_id("brand-captions")).to_have_text("bottom · large", timeout=WAIT_MS)
    assert httpx.get(f"{running.base_url}/v1/brand", headers=headers).json()["logo"] == kit["logo"]
    reading = browser_.console_page(browser, running.base_url)
    reading.open()
    reading.log_in(reader)
    reading.page.get_by_test_id("nav-brand").click()
    expect(reading.page.get_by_test_id("brand-font")).to_have_text("Noto Serif CJK", timeout=WAIT_MS)
    expect(reading.page.get_by_test_id("brand-save")).to_have_count(0)  # a reader edits nothing
    page.get_by_test_id("brand-remove").click()
    expect(page.get_by_test_id("no-brand")).to_be_visible(timeout=WAIT_MS)
    assert httpx.get(f"{running.base_url}/v1/brand", headers=headers).status_code == 404
    texts_complete(console)
    assert console.errors == [] and reading.errors == []


@pytest.mark.timeout(90)
def test_the_usage_page_counts_the_tenants_pipeline_today_charts_it_and_an_admin_picks_the_tenant(shared, browser):
    engine = db.make_engine(shared.installation.database_urls["api"])
    try:
        with db.transaction(engine) as conn:
            usage.set_budget(conn, shared.tenant, usage.Limits("month", 50, 600.0, None))
    finally:
        engine.dispose()
    pipeline_id = shared.submit(briefs.sample("사용량책방"))
    assert shared.wait_terminal([pipeline_id])[pipeline_id].status == "SUCCEEDED"
    today = dt.datetime.now(dt.UTC).date().isoformat()

    def counted(console: browser_.Console) -> None:
        """The tenant's row of today counts its pipeline; both charts are drawn; its budgets are shown."""
        page = console.page
        mine = page.locator(f'[data-testid=usage-days] tbody tr[data-day="{today}"][data-tenant="{shared.tenant}"]')
        expect(mine.locator('td[data-meter="pipelines"]')).to_have_text("1", timeout=WAIT_MS)
        expect(mine.locator('td[data-meter="calls"]')).to_have_text("0 / 0 / 0")  # the local providers: none
        for chart in ("usage-cost", "usage-song-seconds"):
            expect(page.locator(f'figure[data-chart="{chart}"] .series.key-tenant-0 circle').first).to_be_attached()
        expect(page.locator('[data-testid=budgets] tr[data-period="month"][data-limit="pipelines"]')).to_contain_text(
            "50"
        )
        expect(page.get_by_test_id("budget-share")).to_have_count(2)  # pipelines and seconds of song
        expect(page.get_by_test_id("usage-weight")).to_contain_text("1")

    # The tenant's own key (read): its own usage, no tenant to pick.
    console = browser_.console_page(browser, shared.base_url)
    console.open()
    console.log_in(shared.api_key)
    console.page.get_by_test_id("nav-usage").click()
    counted(console)
    expect(console.page.get_by_test_id("usage-tenant")).to_have_count(0)

    # An admin key: every tenant's, then the test's tenant typed into the filter.
    admin = browser_.console_page(browser, shared.base_url)
    admin.open()
    admin.log_in(shared.installation.api_key)
    admin.page.get_by_test_id("nav-usage").click()
    expect(admin.page.locator(f'[data-testid=usage-days] tr[data-tenant="{shared.tenant}"]')).to_have_count(
        1, timeout=WAIT_MS
    )
    expect(admin.page.get_by_test_id("tenant-limits")).to_have_count(0)  # every tenant's: no budgets
    admin.page.get_by_test_id("usage-tenant").fill(shared.tenant)
    admin.page.get_by_test_id("usage-show").click()
    expect(admin.page).to_have_url(re.compile(rf"#/usage\?.*tenant={shared.tenant}"))
    counted(admin)
    admin.screenshot("usage")
    texts_complete(console)
    assert console.errors == [] and admin.errors == []


def select_line(console: browser_.Console, area: str, number: int) -> None:
    """Select the line `number` (from 0) of a textarea, as a person would before typing over it."""
    console.page.get_by_test_id(area).evaluate(
        "(area, number) => { const lines = area.value.split('\\n');"
        " const start = lines.slice(0, number).join('\\n').length + (number ? 1 : 0);"
        " area.focus(); area.setSelectionRange(start, start + lines[number].length); }",
        number,
    )


@pytest.mark.timeout(90)
def test_a_draft_waiting_for_review_is_found_on_the_board_edited_in_place_and_decided_once(shared, browser):
    asked = api.PipelineRequest(**briefs.sample("검토책방").model_dump(), review=brief.Review(timeout_s=600))
    pipeline_id = shared.client.submit(asked).id
    reader = access.create_key(shared.tenant, frozenset({keys.Scope.READ}), "review reader", shared.installation.env())
    console = browser_.console_page(browser, shared.base_url)
    page = console.page
    console.allow("status of 422")  # the edit refused on purpose below
    console.open()
    console.log_in(shared.api_key)

    # The board marks the pipeline as waiting, says for how long, and lists only the waiting ones on a click.
    waiting = row(console, pipeline_id)
    expect(waiting).to_have_attribute("data-status", "AWAITING_REVIEW", timeout=WAIT_MS)
    expect(waiting.get_by_test_id("review-age")).to_contain_text("waiting")
    page.get_by_test_id("filter-reviews").click()
    expect(page.get_by_test_id("filter-status")).to_have_value("AWAITING_REVIEW")
    waiting.locator("a.customer").click()
    expect(page.get_by_test_id("review-call")).to_contain_text("waits for a decision")
    page.get_by_test_id("open-review").click()

    view = shared.client.status(pipeline_id)
    assert view.review is not None and view.review.draft is not None
    draft = view.review.draft
    expect(page.get_by_test_id("review-text")).to_have_value(draft.text, timeout=WAIT_MS)
    expect(page.get_by_test_id("review-left")).to_contain_text(re.compile(r"^\d+ mins?( \d+ secs?)? left$"))
    expect(page.get_by_test_id("review-on-timeout")).to_have_attribute("data-on-timeout", "cancel")
    expect(page.get_by_test_id("review-round")).to_have_text("number 1")
    expect(page.get_by_test_id("review-regenerations-left")).to_have_text(str(draft.regenerations_left))
    expect(page.get_by_test_id("review-edit")).to_be_disabled()  # nothing changed yet

    # A key without submit sees the same draft, and nothing to decide with.
    reading = browser_.console_page(browser, shared.base_url)
    reading.open()
    reading.log_in(reader)
    expect(reading.page.get_by_test_id("tenant")).to_have_text(shared.tenant)
    reading.page.goto(f"{shared.base_url}/ui/#/pipelines/{pipeline_id}/review")
    expect(reading.page.get_by_test_id("review-read-only")).to_be_visible(timeout=WAIT_MS)
    expect(reading.page.get_by_test_id("review-draft-text")).to_contain_text(draft.text.splitlines()[0])
    for control in ("review-text", "review-approve", "review-edit", "review-regenerate"):
        expect(reading.page.get_by_test_id(control)).to_have_count(0)

    # A line typed over in place: too long first (refused, the field and the reason said), then as meant.
    lines = draft.text.split("\n")
    sung = lines.index("[verse]") + 1
    select_line(console, "review-text", sung)
    page.keyboard.insert_text("파도" * 61)
    page.get_by_test_id("review-edit").click()
    refused = page.get_by_test_id("review-error")
    expect(refused).to_have_attribute("data-status", "422")
    expect(refused.locator('[data-field="lyrics"]')).to_contain_text("Lyrics:")
    expect(refused).to_contain_text("122 characters long, more than 120")
    expect(page.get_by_test_id("review-text")).to_have_attribute("aria-invalid", "true")
    select_line(console, "review-text", sung)
    page.keyboard.insert_text("파도 소리 책장 넘기는 소리")
    edited = "\n".join([*lines[:sung], "파도 소리 책장 넘기는 소리", *lines[sung + 1 :]])
    expect(page.get_by_test_id("review-text")).to_have_value(edited)
    expect(page.get_by_test_id("review-changed")).to_have_text("Changed, not saved yet.")
    console.screenshot("review")
    page.get_by_test_id("review-edit").click()

    # Decided: shown read-only, with nothing left to decide with, here and after a reload.
    expect(page.get_by_test_id("review-decided")).to_have_attribute("data-decision", "edit", timeout=WAIT_MS)
    expect(page.get_by_test_id("review-result")).to_have_text("Edit saved: the song is sung as written.")
    assert page.get_by_test_id("review-edited").text_content() == edited
    expect(page.get_by_test_id("pipeline-status")).to_have_attribute("data-status", "SUCCEEDED", timeout=WAIT_MS)
    page.reload()
    expect(page.get_by_test_id("review-decision")).to_have_attribute("data-decision", "edit", timeout=WAIT_MS)
    for control in ("review-text", "review-approve", "review-edit", "review-regenerate"):
        expect(page.get_by_test_id(control)).to_have_count(0)

    final = shared.wait_terminal([pipeline_id])[pipeline_id]
    assert final.status == "SUCCEEDED" and final.review is not None and final.review.draft is not None
    assert (final.review.draft.decision, final.review.draft.edited_text) == ("edit", edited)
    texts_complete(console)
    assert console.errors == [] and reading.errors == []
