import DrivebusSchema
import Foundation

/// The interactive map page: Leaflet from `/static/leaflet`, every trip drawn from the server's
/// tiles on one canvas per tile, filters, colouring, and a trip's details on click.
/// `window.drivebusMap` exposes the map and its progress for the browser tests.
enum MapPage {
    static func html(tileURL: String?, attribution: String?) -> String {
        // Our own writer, not JSONSerialization: sorting its keys compares them by locale, which
        // loads ICU's data into stats at start (4.6 MB of its idle memory, issue 22).
        var writer = JSONWriter()
        writer.beginObject()
        writer.key("attribution")
        writer.string(attribution ?? "")
        writer.key("tileURL")
        writer.string(tileURL ?? "")
        writer.endObject()
        var json = String(decoding: writer.bytes, as: UTF8.self)
        // Inside <script>, no "<" at all: "</script" or "<!--" would change how the page parses.
        json = json.replacingOccurrences(of: "<", with: "\\u003c")
        return template.replacingOccurrences(of: "__SETTINGS__", with: json)
    }

    static let template = #"""
        <!DOCTYPE html>
        <html lang="en">
        <head>
        <meta charset="utf-8">
        <meta name="viewport" content="width=device-width, initial-scale=1">
        <title>drivebus · map</title>
        <link rel="icon" href="data:,">
        <link rel="stylesheet" href="static/leaflet/leaflet.css">
        <style>
        html,body{margin:0;height:100%;font:14px/1.35 system-ui,sans-serif;color:#222}
        #bar{position:absolute;top:0;left:0;right:0;z-index:1000;display:flex;flex-wrap:wrap;gap:8px;align-items:center;padding:6px 10px;background:#fffffff0;border-bottom:1px solid #ddd}
        #bar label{display:flex;gap:4px;align-items:center}
        #bar a{color:#2e6da4}
        #map{position:absolute;top:44px;bottom:0;left:0;right:0;background:#f4f3ef}
        #summary{margin-left:auto;color:#555}
        .legend{background:#fff;padding:6px 8px;border-radius:4px;box-shadow:0 1px 4px #0003;line-height:1.2}
        .legend i{display:inline-block;width:18px;height:4px;margin-right:4px;vertical-align:middle}
        .trip-details td{padding:1px 6px 1px 0}
        </style>
        </head>
        <body>
        <div id="bar">
          <a href="./">drivebus</a>
          <label>Device <select id="device"><option value="">all</option></select></label>
          <label>From <input id="from" type="date"></label>
          <label>To <input id="to" type="date"></label>
          <label>Kind <select id="kind"><option value="">all</option><option>drive</option><option>cycle</option><option>walk</option></select></label>
          <label>Colour <select id="colour"><option value="speed">by speed</option><option value="score">by score</option></select></label>
          <button id="fit" type="button">Fit all</button>
          <span id="summary"></span>
        </div>
        <div id="map"></div>
        <script src="static/leaflet/leaflet.js"></script>
        <script>
        "use strict";
        (function () {
          var settings = __SETTINGS__;
          var state = {drawMs: 0, refreshes: 0, tilesLoading: 0, tilesDrawn: 0, linesDrawn: 0, tripsDrawn: 0, loads: 0, selected: null, error: null, version: ""};
          var idle = [];
          window.drivebusMap = state;

          var map = L.map("map", {zoomControl: true, maxZoom: 20, minZoom: 1, worldCopyJump: true});
          state.map = map;
          L.control.scale({imperial: false}).addTo(map);
          if (settings.tileURL) {
            L.tileLayer(settings.tileURL, {maxZoom: 20, attribution: settings.attribution}).addTo(map);
          }
          map.attributionControl.setPrefix('<a href="https://leafletjs.com">Leaflet</a>');

          function filters() {
            var out = [];
            ["device", "from", "to", "kind"].forEach(function (name) {
              var value = document.getElementById(name).value;
              if (value) out.push(name + "=" + encodeURIComponent(value));
            });
            return out;
          }
          // A trip's colour, as an index into the legend.
          function colourOf(speedDms, scoreX10) {
            if (document.getElementById("colour").value === "score") {
              if (scoreX10 === 0xFFFF) return 4;
              var score = scoreX10 / 10;
              return score >= 90 ? 0 : score >= 75 ? 1 : score >= 60 ? 2 : 3;
            }
            var kmh = speedDms === 0xFFFF ? 0 : speedDms * 0.36;
            return kmh < 10 ? 0 : kmh < 30 ? 1 : kmh < 60 ? 2 : kmh < 90 ? 3 : 4;
          }
          var legends = {
            speed: [["#7b3294", "under 10 km/h average"], ["#2c7bb6", "10–30"], ["#1a9641", "30–60"], ["#fdae61", "60–90"], ["#d7191c", "90 and over"]],
            score: [["#1a9850", "score 90+"], ["#91cf60", "75–90"], ["#fc8d59", "60–75"], ["#d73027", "under 60"], ["#8a8a8a", "not scored"]]
          };
          var legend = L.control({position: "bottomright"});
          legend.onAdd = function () { this._div = L.DomUtil.create("div", "legend"); return this._div; };
          legend.addTo(map);
          function drawLegend() {
            legend._div.innerHTML = legends[document.getElementById("colour").value].map(function (entry) {
              return '<div><i style="background:' + entry[0] + '"></i>' + entry[1] + "</div>";
            }).join("");
          }

          // The trips: one canvas a tile, drawn from the server's binary tile (docs/map.md). A
          // canvas is 512 pixels, the server's tile one zoom up: a quarter of the requests and
          // canvases of 256-pixel tiles, for the same detail.
          var Trips = L.GridLayer.extend({
            createTile: function (coords, done) {
              var tile = document.createElement("canvas");
              var ratio = window.devicePixelRatio || 1, size = this.getTileSize();
              tile.width = size.x * ratio; tile.height = size.y * ratio;
              if (!settings.tileURL) graticule(tile, coords, size, ratio);
              var controller = window.AbortController ? new AbortController() : null;
              tile._abort = controller;
              state.tilesLoading++;
              fetch(tileURL("api/v1/map/tiles/", coords) + "?" + filters().concat(["v=" + state.version]).join("&"),
                    controller ? {signal: controller.signal} : {})
                .then(function (response) {
                  if (!response.ok) return response.json().then(function (answer) { throw new Error(answer.error.message); });
                  return response.arrayBuffer();
                })
                .then(function (buffer) {
                  draw(tile, buffer, ratio);
                  state.tilesDrawn++;
                  done(null, tile);
                })
                .catch(function (error) {
                  if (error.name !== "AbortError") problem(error);
                  done(error, tile);
                })
                .finally(function () { state.tilesLoading--; });
              return tile;
            }
          });
          function tileURL(path, coords) { return path + (coords.z - 1) + "/" + coords.x + "/" + coords.y + ".bin"; }
          var EXTENT = 4096;
          // One path a colour: a stroke per trip would cost more than all the lines together.
          function draw(tile, buffer, ratio) {
            var started = performance.now();
            var view = new DataView(buffer);
            if (buffer.byteLength < 4 || view.getUint8(0) !== 68 || view.getUint8(3) !== 49) throw new Error("not a drivebus map tile");
            var context = tile.getContext("2d");
            var scale = tile.width / EXTENT;
            var paths = [new Path2D(), new Path2D(), new Path2D(), new Path2D(), new Path2D()];
            var offset = 4, segments = 0;
            while (offset + 8 <= buffer.byteLength) {
              var path = paths[colourOf(view.getUint16(offset, true), view.getUint16(offset + 2, true))];
              var end = offset + 8 + view.getUint32(offset + 4, true) * 2;
              offset += 8;
              while (offset < end) {
                var count = view.getInt16(offset, true); offset += 2;
                path.moveTo(view.getInt16(offset, true) * scale, view.getInt16(offset + 2, true) * scale);
                for (var i = 1; i < count; i++) path.lineTo(view.getInt16(offset + 4 * i, true) * scale, view.getInt16(offset + 4 * i + 2, true) * scale);
                segments += count - 1;
                offset += 4 * count;
                state.linesDrawn++;
              }
              state.tripsDrawn++;
            }
            // A busy tile gets hairlines: a canvas without a GPU strokes wider lines many times slower
            // (measured in docs/map.md), and a busy tile is a web of lines either way.
            context.lineWidth = (segments > 500 ? 1 : 2.2) * ratio;
            context.lineJoin = "round"; context.lineCap = "round";
            context.globalAlpha = 0.8;
            var colours = legends[document.getElementById("colour").value];
            paths.forEach(function (path, index) { context.strokeStyle = colours[index][0]; context.stroke(path); });
            state.drawMs += performance.now() - started;
          }
          var trips = new Trips({tileSize: 512, minZoom: 1, maxZoom: 20, updateWhenZooming: false, keepBuffer: 1});
          trips.on("loading", function () { state.loading = true; });
          trips.on("load", function () {
            state.loading = false;
            state.loads++;
            var waiting = idle; idle = [];
            waiting.forEach(function (resolve) { resolve(); });
          });
          trips.on("tileunload", function (event) { if (event.tile._abort) event.tile._abort.abort(); });
          // Resolves once every tile in view is drawn (for the tests and the benchmark).
          state.whenIdle = function () {
            return new Promise(function (resolve) {
              if (!state.loading && state.tilesLoading === 0 && state.loads > 0) resolve(); else idle.push(resolve);
            });
          };

          // A click asks the server for the nearest trip within 8 pixels of it.
          var highlight = null, clicks = 0;
          map.on("click", function (event) {
            // Wrapped: beside the antimeridian, or zoomed far out, the world repeats.
            var zoom = map.getZoom(), point = map.project(event.latlng.wrap(), zoom), size = trips.getTileSize();
            var coords = {z: zoom, x: Math.floor(point.x / size.x), y: Math.floor(point.y / size.y)};
            var units = EXTENT / size.x;
            var query = filters().concat([
              "z=" + (zoom - 1), "x=" + coords.x, "y=" + coords.y, "radius=" + Math.round(8 * units),
              "unit_x=" + Math.round((point.x - coords.x * size.x) * units), "unit_y=" + Math.round((point.y - coords.y * size.y) * units)
            ]);
            var click = ++clicks;
            fetch("api/v1/map/pick?" + query.join("&")).then(function (r) { return r.json(); }).then(function (answer) {
              if (answer.error) throw new Error(answer.error.message);
              if (click !== clicks) return;  // a later click decides
              if (answer.trip_id) select(answer.trip_id, event.latlng, click); else unselect();
            }).catch(problem);
          });
          function unselect() {
            if (highlight) { map.removeLayer(highlight); highlight = null; }
            state.selected = null;
            map.closePopup();
          }
          function select(id, at, click) {
            fetch("api/v1/trips/" + encodeURIComponent(id)).then(function (r) { return r.json(); }).then(function (trip) {
              if (trip.error) throw new Error(trip.error.message);
              if (click !== clicks) return;
              unselect();
              // The trip in black, its stretches over the speed limit in red on top.
              highlight = L.featureGroup([L.polyline((trip.track || []).map(function (p) { return [p[0], p[1]]; }),
                {color: "#111", weight: 6, opacity: 0.85, interactive: false})].concat((trip.speeding || []).map(function (stretch) {
                return L.polyline(stretch.track, {color: "#e01010", weight: 6, opacity: 0.95, interactive: false, className: "speeding"});
              }))).addTo(map);
              var score = trip.score && trip.score.score !== null ? String(trip.score.score) : "not scored";
              var rows = [
                ["Device", trip.device], ["Start", trip.start_time], ["End", trip.end_time],
                ["Distance", ((trip.distance_m || 0) / 1000).toFixed(1) + " km"],
                ["Duration", Math.round((trip.duration_s || 0) / 60) + " min"], ["Score", score]
              ];
              if ((trip.speeding || []).length) {
                var worst = trip.speeding.reduce(function (a, b) { return (b.over_kmh || 0) > (a.over_kmh || 0) ? b : a; });
                rows.push(["Over the limit", trip.speeding.length + " stretch" + (trip.speeding.length > 1 ? "es" : "") + " (red), worst " +
                  (worst.over_kmh || 0).toFixed(0) + " km/h over " + (worst.limit_kmh || "?") + " (" + (worst.limit_source || "?") + ")"]);
              }
              var table = document.createElement("table");
              table.className = "trip-details";
              rows.forEach(function (row) {
                var tr = table.insertRow(); tr.insertCell().textContent = row[0]; tr.insertCell().textContent = row[1];
              });
              L.popup().setLatLng(at).setContent(table).openOn(map);
              state.selected = {id: trip.trip_id || id, device: trip.device, distance_m: trip.distance_m, score: trip.score ? trip.score.score : null};
            }).catch(problem);
          }

          // A plain background's graticule: meridians and parallels at a round step for the
          // zoom, labelled along each tile's top and left edges.
          function graticule(tile, coords, size, ratio) {
            var context = tile.getContext("2d");
            context.save();
            context.scale(ratio, ratio);
            // A round step (1, 2 or 5 × 10ⁿ degrees) of at least 120 pixels at this zoom.
            var wanted = 120 * 360 / (256 * Math.pow(2, coords.z)), power = Math.pow(10, Math.floor(Math.log10(wanted)));
            var step = [1, 2, 5, 10].map(function (m) { return m * power; }).filter(function (v) { return v >= wanted; })[0];
            var nw = map.unproject([coords.x * size.x, coords.y * size.y], coords.z);
            var se = map.unproject([(coords.x + 1) * size.x, (coords.y + 1) * size.y], coords.z);
            context.strokeStyle = "#dcd9cf"; context.lineWidth = 1;
            context.fillStyle = "#9a968a"; context.font = "10px sans-serif";
            for (var lon = Math.ceil(nw.lng / step) * step; lon <= se.lng; lon += step) {
              var x = Math.round(map.project([0, lon], coords.z).x - coords.x * size.x) + 0.5;
              context.beginPath(); context.moveTo(x, 0); context.lineTo(x, size.y); context.stroke();
              context.fillText(+lon.toFixed(5) + "°", x + 3, 11);
            }
            for (var lat = Math.ceil(se.lat / step) * step; lat <= nw.lat; lat += step) {
              var y = Math.round(map.project([lat, 0], coords.z).y - coords.y * size.y) + 0.5;
              context.beginPath(); context.moveTo(0, y); context.lineTo(size.x, y); context.stroke();
              context.fillText(+lat.toFixed(5) + "°", 3, y - 3);
            }
            context.restore();
          }

          // What the filters match, and the data's version: a new version draws the tiles again.
          var refreshes = 0;
          function refresh(fit) {
            var mine = ++refreshes;
            fetch("api/v1/map/bounds?" + filters().join("&")).then(function (r) { return r.json(); }).then(function (bounds) {
              if (bounds.error) throw new Error(bounds.error.message);
              if (mine !== refreshes) return;  // the filters changed since
              var changed = state.version !== String(bounds.version);
              state.version = String(bounds.version);
              state.trips = bounds.trips;
              document.getElementById("summary").textContent = bounds.trips + (bounds.trips === 1 ? " trip" : " trips");
              if (fit || !map._loaded) {
                if (bounds.bounds) map.fitBounds(bounds.bounds, {padding: [20, 20], maxZoom: 16, animate: false});
                else map.setView([30, 0], 2, {animate: false});
              }
              if (!map.hasLayer(trips)) trips.addTo(map); else if (fit || changed) trips.redraw();
              state.refreshes++;
            }).catch(function (error) {
              problem(error);
              if (!map._loaded) map.setView([30, 0], 2, {animate: false});
            });
          }
          function problem(error) {
            state.error = String(error);
            document.getElementById("summary").textContent = String(error.message || error);
          }
          // New trips appear without a reload.
          setInterval(function () { if (!document.hidden) refresh(false); }, 15000);
          // Filters come from the address (`map?device=car&from=2026-01-01`), and go back to it,
          // so that a view can be linked to.
          var initial = new URLSearchParams(location.search);
          ["device", "from", "to", "kind", "colour"].forEach(function (name) {
            var value = initial.get(name), control = document.getElementById(name);
            if (!value) return;
            if (control.tagName === "SELECT" && !hasOption(control, value)) {
              var option = document.createElement("option");
              option.textContent = value;
              control.appendChild(option);
            }
            control.value = value;
          });
          function hasOption(select, value) {
            return Array.prototype.some.call(select.options, function (option) { return (option.value || option.textContent) === value; });
          }
          function remember() {
            var colour = document.getElementById("colour").value;
            var query = filters().concat(colour === "speed" ? [] : ["colour=" + colour]).join("&");
            history.replaceState(null, "", query ? "?" + query : location.pathname);
          }
          ["device", "from", "to", "kind"].forEach(function (name) {
            document.getElementById(name).addEventListener("change", function () { unselect(); remember(); refresh(true); });
          });
          document.getElementById("colour").addEventListener("change", function () { drawLegend(); remember(); trips.redraw(); });
          document.getElementById("fit").addEventListener("click", function () { refresh(true); });
          fetch("api/v1/devices").then(function (r) { return r.json(); }).then(function (answer) {
            var select = document.getElementById("device");
            (answer.devices || []).forEach(function (device) {
              if (hasOption(select, device.device)) return;
              var option = document.createElement("option");
              option.textContent = device.device;
              select.appendChild(option);
            });
          }).catch(function () {});
          drawLegend();
          refresh(true);
        })();
        </script>
        </body>
        </html>

        """#
}
