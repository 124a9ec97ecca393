import Foundation

/// Small SVG charts drawn on the server: the dashboard's bars and the route profiles. No
/// scripts and no fonts beyond the system's, so they work on a LAN without internet.
package enum Charts {
    package struct Series {
        package var name: String
        package var color: String
        package var values: [Double]

        package init(name: String, color: String, values: [Double]) {
            self.name = name
            self.color = color
            self.values = values
        }
    }

    package static func px(_ value: Double) -> String { Decimal64.text(value.isFinite ? value : 0, places: 1) }

    package static func escape(_ text: String) -> String { Markup.escape(text) }

    /// 1, 2 or 5 times a power of ten, at least `raw`.
    package static func niceStep(_ raw: Double) -> Double {
        guard raw.isFinite, raw > 0 else { return 1 }
        let magnitude = pow(10, floor(log10(raw)))
        return [1.0, 2, 5, 10].map { $0 * magnitude }.first { $0 >= raw * 0.999_999 } ?? 10 * magnitude
    }

    /// An axis from `lower` to `upper` in about `count` round steps.
    /// `minStep` keeps counts from getting ticks like 0.5.
    package static func axis(_ lower: Double, _ upper: Double, count: Int, minStep: Double = 0) -> (lower: Double, upper: Double, step: Double) {
        var lower = lower, upper = upper
        if !(upper > lower) { upper = lower + max(1, minStep * Double(count)) }
        let step = max(minStep, niceStep((upper - lower) / Double(max(1, count))))
        lower = floor(lower / step + 1e-9) * step
        upper = ceil(upper / step - 1e-9) * step
        return (lower, upper, step)
    }

    /// A label that may hold a second line after "\n".
    package static func label(x: Double, y: Double, _ text: String, anchor: String = "middle", extra: String = "") -> String {
        let lines = text.split(separator: "\n", omittingEmptySubsequences: false)
        var out = "<text x=\"\(px(x))\" y=\"\(px(y))\" text-anchor=\"\(anchor)\"\(extra)>"
        for (index, line) in lines.enumerated() {
            out += index == 0 ? escape(String(line)) : "<tspan x=\"\(px(x))\" dy=\"1.2em\">\(escape(String(line)))</tspan>"
        }
        return out + "</text>"
    }

    /// Bars for one series, or several side by side per label. Values may be negative.
    package static func bars(
        labels: [String], series: [Series], tooltips: [[String]]? = nil, highlight: Int? = nil, width: Double, height: Double,
        tick: (Double) -> String, minStep: Double = 1, title: String, empty: String, legend: Bool = false
    ) -> String {
        let top = legend ? 34.0 : 12.0, bottom = 36.0, left = 56.0, right = 8.0
        let plotW = max(10, width - left - right), plotH = max(10, height - top - bottom)
        let all = series.flatMap(\.values).filter(\.isFinite)
        let (lower, upper, step) = axis(min(0, all.min() ?? 0), max(0, all.max() ?? 0), count: 4, minStep: minStep)
        func y(_ value: Double) -> Double { top + plotH - (value - lower) / (upper - lower) * plotH }

        var out = "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart\" viewBox=\"0 0 \(px(width)) \(px(height))\" width=\"\(px(width))\" height=\"\(px(height))\" role=\"img\" aria-label=\"\(escape(title))\">"
        out += "<title>\(escape(title))</title>"
        // Grid and tick labels.
        var value = lower
        while value <= upper + step / 2 {
            let ty = y(value)
            out += "<line class=\"grid\" x1=\"\(px(left))\" y1=\"\(px(ty))\" x2=\"\(px(left + plotW))\" y2=\"\(px(ty))\"/>"
            out += label(x: left - 6, y: ty + 4, tick(abs(value) < step / 1e6 ? 0 : value), anchor: "end", extra: " class=\"tick\"")
            value += step
        }
        if legend {
            var x = left
            for item in series {
                out += "<rect x=\"\(px(x))\" y=\"8\" width=\"12\" height=\"12\" rx=\"2\" fill=\"\(item.color)\"/>"
                out += "<text x=\"\(px(x + 17))\" y=\"18\" class=\"legend\">\(escape(item.name))</text>"
                x += 30 + Double(item.name.count) * 7.2
            }
        }
        let band = plotW / Double(max(1, labels.count))
        let groupW = band * (series.count > 1 ? 0.84 : 0.68)
        let barW = groupW / Double(max(1, series.count))
        for index in labels.indices {
            let x0 = left + band * Double(index) + (band - groupW) / 2
            for (s, item) in series.enumerated() where index < item.values.count {
                let v = item.values[index].isFinite ? item.values[index] : 0
                let y0 = y(0), y1 = y(v)
                let tip = tooltips?[s][index] ?? "\(labels[index]): \(tick(v))"
                let opacity = highlight == nil || highlight == index ? "" : " fill-opacity=\"0.55\""
                out += "<rect x=\"\(px(x0 + barW * Double(s)))\" y=\"\(px(min(y0, y1)))\" width=\"\(px(max(1, barW - (series.count > 1 ? 1 : 0))))\" height=\"\(px(max(v == 0 ? 0 : 1, abs(y1 - y0))))\" fill=\"\(item.color)\"\(opacity)><title>\(escape(tip.replacingOccurrences(of: "\n", with: " ")))</title></rect>"
            }
            out += label(x: x0 + groupW / 2, y: top + plotH + 14, labels[index], extra: " class=\"tick\"")
        }
        out += "<line class=\"axis\" x1=\"\(px(left))\" y1=\"\(px(y(0)))\" x2=\"\(px(left + plotW))\" y2=\"\(px(y(0)))\"/>"
        if all.allSatisfy({ $0 == 0 }) {
            out += "<text x=\"\(px(left + plotW / 2))\" y=\"\(px(top + plotH / 2))\" text-anchor=\"middle\" class=\"empty\">\(escape(empty))</text>"
        }
        return out + "</svg>"
    }

    /// Every route's elevation profile in its rank colour, flattest drawn last (on top), with
    /// both axes in metres and a legend in rank order.
    package static func profiles(_ ranked: [RankedRoute], width: Double, height: Double, standalone: Bool) -> String {
        let width = max(300, min(10_000, width)), height = max(200, min(10_000, height))
        let legendH = 20.0 * Double(ranked.count) + 8
        let left = 72.0, right = 24.0, top = 16.0 + legendH, bottom = 56.0
        let plotW = max(10, width - left - right), plotH = max(10, height - top - bottom)
        let maxD = ranked.compactMap { $0.distancesM.last }.max() ?? 0
        let elevations = ranked.flatMap(\.elevationsM)
        let x = axis(0, max(maxD, 1), count: 8)
        let y = axis(elevations.min() ?? 0, max((elevations.max() ?? 1), (elevations.min() ?? 0) + 10), count: 5)
        func sx(_ d: Double) -> Double { left + d / (x.upper - x.lower) * plotW }
        func sy(_ e: Double) -> Double { top + plotH - (e - y.lower) / (y.upper - y.lower) * plotH }

        var out = standalone ? "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n" : ""
        out += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"\(px(width))\" height=\"\(px(height))\" viewBox=\"0 0 \(px(width)) \(px(height))\" font-family=\"sans-serif\" font-size=\"12\">\n"
        out += "<title>Elevation profiles of \(ranked.count) routes, flattest first</title>\n"
        out += "<rect width=\"\(px(width))\" height=\"\(px(height))\" fill=\"#ffffff\"/>\n<g stroke=\"#e3e3e3\" stroke-width=\"1\">"
        var d = x.lower
        var xTicks: [Double] = []
        while d <= x.upper + x.step / 2 { xTicks.append(d); d += x.step }
        var e = y.lower
        var yTicks: [Double] = []
        while e <= y.upper + y.step / 2 { yTicks.append(e); e += y.step }
        for t in xTicks { out += "<line x1=\"\(px(sx(t)))\" y1=\"\(px(top))\" x2=\"\(px(sx(t)))\" y2=\"\(px(top + plotH))\"/>" }
        for t in yTicks { out += "<line x1=\"\(px(left))\" y1=\"\(px(sy(t)))\" x2=\"\(px(left + plotW))\" y2=\"\(px(sy(t)))\"/>" }
        out += "</g>\n<g fill=\"#333\">"
        for t in xTicks { out += "<text x=\"\(px(sx(t)))\" y=\"\(px(top + plotH + 18))\" text-anchor=\"middle\">\(Decimal64.text(t, places: 0))</text>" }
        for t in yTicks { out += "<text x=\"\(px(left - 8))\" y=\"\(px(sy(t) + 4))\" text-anchor=\"end\">\(Decimal64.text(t, places: 1))</text>" }
        out += "<text x=\"\(px(left + plotW / 2))\" y=\"\(px(height - 12))\" text-anchor=\"middle\">distance (m)</text>"
        out += "<text transform=\"translate(18 \(px(top + plotH / 2))) rotate(-90)\" text-anchor=\"middle\">elevation (m)</text></g>\n"
        out += "<path d=\"M\(px(left)) \(px(top))V\(px(top + plotH))H\(px(left + plotW))\" fill=\"none\" stroke=\"#333\" stroke-width=\"1.2\"/>\n"
        out += "<g fill=\"none\" stroke-width=\"2.4\" stroke-linejoin=\"round\" stroke-linecap=\"round\">\n"
        for route in ranked.reversed() {
            out += "<polyline data-route=\"\(escape(route.name))\" data-rank=\"\(route.rank)\" stroke=\"\(route.rankColor)\" points=\""
            var previous = ""
            for i in route.distancesM.indices {
                let pair = px(sx(route.distancesM[i])) + "," + px(sy(route.elevationsM[i]))
                if pair == previous { continue }
                out += (previous.isEmpty ? "" : " ") + pair
                previous = pair
            }
            out += "\"/>\n"
        }
        out += "</g>\n<g font-size=\"13\">"
        for (position, route) in ranked.enumerated() {
            let ly = 16.0 + 20 * Double(position)
            out += "<line x1=\"\(px(left))\" y1=\"\(px(ly + 8))\" x2=\"\(px(left + 26))\" y2=\"\(px(ly + 8))\" stroke=\"\(route.rankColor)\" stroke-width=\"4\"/>"
            out += "<text x=\"\(px(left + 34))\" y=\"\(px(ly + 12))\" fill=\"#222\">\(route.rank). \(escape(route.name)): \(Decimal64.text(route.distanceM, places: 0)) m, "
                + "\(Decimal64.text(route.ascentM, places: 0)) m up, \(Decimal64.text(route.descentM, places: 0)) m down, steepest \(Decimal64.text(route.maxGradePct, places: 1)) %</text>"
        }
        out += "</g>\n</svg>\n"
        return out
    }
}
