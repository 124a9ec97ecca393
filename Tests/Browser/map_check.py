#!/usr/bin/env python3
"""Drives drivebus's interactive map (`/map` on the stats service) in headless Chromium.

Loads the page, waits until every tile in view is drawn, zooms and pans, clicks a trip, filters by
device, and prints one JSON object of what it saw and how long each step took. The system test
(Tests/SystemTests/MapBrowserTests.swift) and `drivebus-bench map --browser` read it.

Needs Debian's chromium, chromium-driver and python3-selenium (deploy/setup installs them).
"""
import argparse
import json
import os
import sys
import tempfile

from selenium import webdriver
from selenium.common.exceptions import TimeoutException
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

# Times a step from the call to every tile drawn, in the page's own clock.
STEP = """
const [action, done] = [arguments[0], arguments[arguments.length - 1]];
const state = window.drivebusMap, map = state.map;
const started = performance.now();
const actions = {
  zoomIn: () => map.setZoom(map.getZoom() + 1, {animate: false}),
  zoomOut: () => map.setZoom(map.getZoom() - 1, {animate: false}),
  panRight: () => map.panBy([300, 0], {animate: false}),
  panDown: () => map.panBy([0, 200], {animate: false}),
  panLeft: () => map.panBy([-300, 0], {animate: false}),
};
actions[action]();
state.whenIdle().then(() => done({ms: performance.now() - started, zoom: map.getZoom()}));
"""

# Pixels in a trip colour on the tiles in view: proof that lines were drawn, not only fetched
# (the graticule drawn under them is grey, and not counted).
PAINTED = """
let painted = 0, tiles = 0;
document.querySelectorAll('.leaflet-tile-pane canvas').forEach(canvas => {
  tiles++;
  const data = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
  for (let i = 0; i < data.length; i += 4) {
    const high = Math.max(data[i], data[i + 1], data[i + 2]), low = Math.min(data[i], data[i + 1], data[i + 2]);
    if (data[i + 3] > 0 && high - low > 40) painted++;
  }
});
return {painted: painted, tiles: tiles};
"""


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True, help="the stats service, e.g. http://127.0.0.1:8091")
    parser.add_argument("--query", default="", help="filters in the page's address, e.g. device=car")
    parser.add_argument("--click", help="LAT,LON on a trip to click")
    parser.add_argument("--device", help="a device to filter by at the end")
    parser.add_argument("--steps", default="zoomIn,zoomIn,panRight,panDown,zoomOut,panLeft,zoomIn,zoomIn")
    parser.add_argument("--screenshot", help="a PNG of the first view")
    parser.add_argument("--timeout", type=float, default=60)
    args = parser.parse_args()

    # Chromium leaves its singleton folders in TMPDIR after it quits: one of ours, removed at exit.
    scratch = tempfile.TemporaryDirectory(prefix="drivebus-browser-", ignore_cleanup_errors=True)
    os.environ["TMPDIR"] = scratch.name
    options = Options()
    for flag in ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--enable-precise-memory-info",
                 "--window-size=1280,900", "--no-first-run", "--disable-extensions"]:
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    driver.set_script_timeout(args.timeout)
    result = {}
    try:
        driver.get(args.url + "/map" + ("?" + args.query if args.query else ""))
        result["first_view_ms"] = driver.execute_async_script(
            "const done = arguments[0]; window.drivebusMap.whenIdle().then(() => done(performance.now()));")
        first = driver.execute_script(
            "const s = window.drivebusMap; return {trips: s.trips, zoom: s.map.getZoom(), tiles: s.tilesDrawn, lines: s.linesDrawn, error: s.error};")
        result.update(first)
        result.update(driver.execute_script(PAINTED))
        if args.screenshot:
            driver.save_screenshot(args.screenshot)

        result["steps"] = [dict(driver.execute_async_script(STEP, step), action=step) for step in args.steps.split(",") if step]

        if args.click:
            lat, lon = (float(part) for part in args.click.split(","))
            driver.execute_script("window.drivebusMap.map.setView([arguments[0], arguments[1]], 15, {animate: false});", lat, lon)
            driver.execute_async_script("const done = arguments[0]; window.drivebusMap.whenIdle().then(() => done());")
            point = driver.execute_script(
                "const p = window.drivebusMap.map.latLngToContainerPoint([arguments[0], arguments[1]]); return [p.x, p.y];", lat, lon)
            element = driver.find_element(By.ID, "map")
            size = element.size
            ActionChains(driver).move_to_element_with_offset(
                element, int(point[0] - size["width"] / 2), int(point[1] - size["height"] / 2)).click().perform()
            driver.execute_async_script("""
                const done = arguments[0], started = performance.now();
                (function wait() {
                  if (window.drivebusMap.selected || performance.now() - started > 10000) done(); else setTimeout(wait, 20);
                })();""")
            result["selected"] = driver.execute_script("return window.drivebusMap.selected;")
            # Leaflet fades a popup in, and WebDriver's text is only what is visible: wait for it.
            def popup_text():
                popups = driver.find_elements(By.CSS_SELECTOR, ".leaflet-popup-content")
                return popups[0].text if popups else None
            try:
                WebDriverWait(driver, 5, poll_frequency=0.02).until(lambda _: popup_text())
            except TimeoutException:
                pass
            result["popup"] = popup_text()
            # The picked trip's stretches over the speed limit, drawn in red (SVG paths).
            result["speeding_paths"] = len(driver.find_elements(By.CSS_SELECTOR, "path.speeding"))

        if args.device:
            before = driver.execute_script("return window.drivebusMap.refreshes;")
            Select(driver.find_element(By.ID, "device")).select_by_visible_text(args.device)
            driver.execute_async_script("""
                const [before, done] = arguments;
                (function wait() {
                  if (window.drivebusMap.refreshes > before) window.drivebusMap.whenIdle().then(() => done());
                  else setTimeout(wait, 20);
                })();""", before)
            result["filtered"] = driver.execute_script(
                "return {trips: window.drivebusMap.trips, summary: document.getElementById('summary').textContent};")
            result["filtered"].update(driver.execute_script(PAINTED))

        result["js_heap_bytes"] = driver.execute_script("return performance.memory ? performance.memory.usedJSHeapSize : null;")
        result["error"] = driver.execute_script("return window.drivebusMap.error;")
        result["console"] = [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
    finally:
        driver.quit()
        scratch.cleanup()
    json.dump(result, sys.stdout)
    print()


if __name__ == "__main__":
    main()
