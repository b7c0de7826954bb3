"""The console's Traffic page in Chromium under the console's Content-Security-Policy:
its charts drawn, client data escaped, the report job's state, with a screenshot in
``test-artifacts/``.  The page is the rendered template served with the console's
headers (``served_page``), not a broker."""

from __future__ import annotations

from chromium import ARTIFACTS, CHROMIUM, NEEDS_CHROMIUM, sync_api
from traffic_reports import EVIL


@NEEDS_CHROMIUM
def test_traffic_page_draws_its_charts_in_chromium(served_page: str) -> None:
    """The Traffic page draws its charts under the console's CSP with client data escaped,
    and shows the failed report job's output."""
    errors: list[str] = []
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                    args=["--no-sandbox", "--disable-gpu",
                                          "--disable-background-networking",
                                          "--no-first-run"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.on("console", lambda m: errors.append(m.text) if m.type == "error"
                    else None)
            page.goto(served_page)
            for chart in ("traffic-per-minute", "traffic-durations", "traffic-wills"):
                sync_api.expect(page.locator(f"#{chart}[data-drawn='1'] canvas")
                                ).to_have_count(1, timeout=15_000)
            legend = page.locator("#traffic-per-minute .u-legend").inner_text()
            assert EVIL in legend and "plant/1/temp" in legend
            assert page.evaluate("typeof window.alertCalled") == "undefined"
            job = page.locator("#report-job")
            sync_api.expect(job.get_by_role("button", name="Run report now")).to_be_enabled()
            assert "failed, exit status 2" in job.inner_text()
            assert page.locator("#report-job-output").inner_text().splitlines() == [
                "stage 2/5", "<b>java</b> not found: apt-get install default-jre-headless"]
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "11-traffic.png"), full_page=True)
        finally:
            browser.close()
    assert errors == []
