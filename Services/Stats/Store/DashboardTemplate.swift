import Mustache
import StatsCore

/// The dashboard page. Values are escaped for XHTML (`Markup.escape`, control characters
/// included, so the page stays well-formed XML); `{{{…}}}` inserts the SVG charts and map, which
/// are generated markup.
enum DashboardTemplate {
    static let page: MustacheTemplate = {
        MustacheContentTypes.register(XHTMLContentType(), named: "XHTML")
        // The text below is a constant, checked by the tests: a parse error is a programming error.
        return try! MustacheTemplate(string: text)
    }()

    struct XHTMLContentType: MustacheContentType {
        func escapeText(_ text: String) -> String { Markup.escape(text) }
    }

    static let text = """
        {{% CONTENT_TYPE: XHTML}}<!DOCTYPE html>
        <html xmlns="http://www.w3.org/1999/xhtml" lang="en">
        <head>
        <meta charset="utf-8"/>
        <meta name="viewport" content="width=device-width, initial-scale=1"/>
        <title>drivebus</title>
        <style>{{{style}}}</style>
        </head>
        <body>
        <header><h1>drivebus</h1><p class="sub">{{scope}} · {{drivesEver}} drives recorded · updated {{updated}} UTC</p></header>
        <main>
        {{#thisMonth}}
        <section id="this-month"><h2>This month · {{name}}</h2><div class="cards">{{#cards}}<div class="card"><div class="label">{{label}}</div><div class="value">{{value}}</div></div>{{/cards}}</div></section>
        {{/thisMonth}}
        <section id="last-12-months"><h2>Last 12 months</h2><div class="charts">{{#yearCharts}}<figure><figcaption>{{title}}</figcaption>{{{svg}}}</figure>{{/yearCharts}}</div></section>
        <section id="costs"><h2>Costs per month · own car against rentals</h2>
        {{#costs}}
        <figure class="wide">{{{chart}}}</figure>
        <table class="totals"><thead><tr><th>Last 12 months</th><th class="num">Total</th></tr></thead><tbody>{{#totals}}<tr{{#best}} class="best"{{/best}}><td>{{name}}</td><td class="num">{{amount}}</td></tr>{{/totals}}</tbody></table>
        {{#noRentals}}<p class="note">No rental services configured to compare with (<code>costs.rentals</code>).</p>{{/noRentals}}
        {{/costs}}
        {{^costs}}<p class="note">No costs yet: add a <code>costs:</code> section to drivebus.yaml, or post the own car's expenses to <code>/api/v1/costs/expenses</code> (see docs/costs.md).</p>{{/costs}}
        </section>
        <section id="trips"><h2>Recent trips</h2>
        {{#trips}}<table class="trips"><thead><tr><th>Start (UTC)</th><th>Device</th><th class="num">Distance</th><th class="num">Duration</th><th class="num">Score</th><th>Events</th><th>Candidate</th></tr></thead><tbody>
        {{#rows}}<tr data-trip="{{id}}"><td>{{start}}</td><td>{{device}}</td><td class="num">{{distance}}</td><td class="num">{{duration}}</td><td class="num">{{#score}}<span class="score {{grade}}">{{value}}</span>{{/score}}{{^score}}<span class="muted">not scored</span>{{/score}}</td><td>{{#scored}}{{#events}}<span class="event">{{name}}</span> {{/events}}{{^events}}<span class="muted">none</span>{{/events}}{{/scored}}{{^scored}}<span class="muted">–</span>{{/scored}}</td><td>{{candidate}}</td></tr>
        {{/rows}}
        </tbody></table>{{/trips}}
        {{^trips}}<p class="note">No trips yet.</p>{{/trips}}
        </section>
        <section id="map"><h2>{{mapTitle}} · <a href="{{mapLink}}">interactive map</a></h2><div class="map">{{{mapSVG}}}</div></section>
        <section id="away"><h2>Time away from home · last 30 days</h2>
        {{#away}}<figure class="wide">{{{away}}}</figure>{{/away}}
        {{^away}}<p class="note">No home set: give a device a <code>home</code> zone in drivebus.yaml to see this.</p>{{/away}}
        </section>
        <section id="devices"><h2>Devices</h2>
        {{#devices}}<table class="devices"><thead><tr><th>Device</th><th>From</th><th>App</th><th class="num">Battery</th><th>Last fix (UTC)</th><th>Where</th><th></th></tr></thead><tbody>
        {{#rows}}<tr data-device="{{name}}"><td>{{name}}</td><td>{{origin}}</td><td>{{app}}</td><td class="num">{{battery}}</td><td>{{lastFix}}</td><td>{{position}}</td><td>{{#canSetUp}}<button type="button" data-setup="{{name}}">Set up phone</button>{{/canSetUp}}</td></tr>
        {{/rows}}
        </tbody></table>
        <div id="setup" hidden="hidden"><h3 id="setup-title"></h3><p id="setup-scan"></p><img id="setup-code" alt="setup code" width="240" height="240"/><p><a id="setup-link"></a></p><pre id="setup-by-hand"></pre><p class="note">The token is in this code and nowhere else: drivebus keeps only a hash of it.</p></div>
        <script>//<![CDATA[
        document.querySelectorAll("button[data-setup]").forEach(function (button) {
          button.addEventListener("click", function () {
            var device = button.getAttribute("data-setup");
            if (!window.confirm("A new setup code gives " + device + " a new token; the one on the phone stops working. Go on?")) return;
            fetch("api/v1/devices/" + encodeURIComponent(device) + "/setup", {method: "POST", headers: {"X-Drivebus-Action": "setup"}})
              .then(function (response) { return response.json(); })
              .then(function (setup) {
                var show = function (id, text) { document.getElementById(id).textContent = text; };
                if (setup.error) { show("setup-title", setup.error.message); show("setup-scan", ""); show("setup-by-hand", ""); }
                else {
                  show("setup-title", "Set up " + setup.device + " (" + setup.app + ")");
                  show("setup-scan", setup.scan);
                  show("setup-by-hand", setup.by_hand);
                  document.getElementById("setup-code").src = "data:image/svg+xml;charset=utf-8," + encodeURIComponent(setup.svg);
                  var link = document.getElementById("setup-link");
                  link.textContent = setup.code;
                  link.href = setup.code;
                }
                document.getElementById("setup").hidden = false;
              });
          });
        });
        //]]></script>{{/devices}}
        {{^devices}}<p class="note">No device yet: <code>drivebus device add my-phone</code> adds the first and shows how to connect it.</p>{{/devices}}
        </section>
        <section id="school"><h2>Driving-school candidates</h2>
        {{#candidates}}<table class="candidates"><thead><tr><th>Candidate</th><th class="num">Sessions</th><th class="num">Drives</th><th class="num">Distance</th><th class="num">Latest score</th><th class="num">Average</th><th>Last session (UTC)</th></tr></thead><tbody>
        {{#rows}}<tr data-candidate="{{name}}"><td><a href="{{link}}">{{name}}</a></td><td class="num">{{sessions}}</td><td class="num">{{drives}}</td><td class="num">{{distance}}</td><td class="num">{{#latest}}<span class="score {{grade}}">{{value}}</span>{{/latest}}{{^latest}}<span class="muted">–</span>{{/latest}}</td><td class="num">{{average}}</td><td>{{lastSession}}</td></tr>
        {{/rows}}
        </tbody></table>{{/candidates}}
        {{^candidates}}<p class="note">No driving-school sessions yet.</p>{{/candidates}}
        </section>
        </main>
        <footer>drivebus · times in UTC · <a href="api/v1/trips">trips</a> · <a href="api/v1/stats/monthly">monthly</a> · <a href="map">map</a> · <a href="map.svg">map.svg</a> · <a href="api/v1/costs">costs</a></footer>
        </body>
        </html>

        """
}
