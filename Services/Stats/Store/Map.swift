import DrivebusGeo
import DrivebusSchema
import Foundation
import StatsCore
import GRDB

/// The map of all drives (the "spider web"): every trip's track from `trip.ended`, simplified
/// again with Douglas-Peucker at `mapToleranceM`.
extension StatsStore {
    /// An SVG drawing of the same tracks as `map.geojson`: no tiles, a local projection fitted to
    /// `width` × `height` pixels, one `<polyline>` per trip, and a scale bar.
    /// `newest` draws only that many of the latest trips (the dashboard's; `/map` has them all).
    public func mapSVG(_ query: StatsQuery, width: Int = 1200, height: Int = 900, newest: Int? = nil) async throws -> [UInt8] {
        let configuration = configuration
        let tracks = try await pool.read { db in
            var tracks: [MapQueries.Track] = []
            try MapQueries.eachTrack(db, query: query, toleranceM: configuration.mapToleranceM, newest: newest) { tracks.append($0) }
            return tracks
        }
        let homes = query.device.map { device in self.homes[device].map { [$0] } ?? [] } ?? Array(self.homes.values)
        return MapQueries.svg(tracks, homes: homes, width: width, height: height)
    }
}

enum MapQueries {
    struct Track: Sendable {
        var trip: ExportQueries.TripRow
        var points: [Coordinate]
    }

    /// Trips with at least two track points, oldest first.
    static func eachTrack(_ db: Database, query: StatsQuery, toleranceM: Double, newest: Int? = nil, _ body: (Track) throws -> Void) throws {
        try ExportQueries.eachTrip(db, query: query, newest: newest) { trip in
            var row = trip
            let points = TripQueries.parseTrack(trip.track)
            row.track = ""
            guard points.count >= 2 else { return }
            try body(Track(trip: row, points: DouglasPeucker.simplified(points, epsilonM: max(0, toleranceM))))
        }
    }

    static func geoJSON(_ db: Database, query: StatsQuery, toleranceM: Double, out: inout ChunkWriter) throws {
        out.append("{\"type\":\"FeatureCollection\",\"features\":[\n")
        var first = true
        try eachTrack(db, query: query, toleranceM: toleranceM) { track in
            if !first { out.append(",\n") }
            first = false
            out.append("{\"type\":\"Feature\",\"geometry\":{\"type\":\"LineString\",\"coordinates\":[")
            for (index, point) in track.points.enumerated() {
                if index > 0 { out.byte(",") }
                // Six decimals are 0.1 m: plenty for a map, and a third of the bytes.
                out.byte("["); out.append(Decimal64.text(point.lon, places: 6))
                out.byte(","); out.append(Decimal64.text(point.lat, places: 6)); out.byte("]")
            }
            out.append("]},\"properties\":")
            ExportQueries.writeTripProperties(track.trip, to: &out)
            out.byte("}")
            try out.flushIfFull()
        }
        out.append("\n]}\n")
    }

    static func svg(_ tracks: [Track], homes: [HomeCircle], width: Int, height: Int) -> [UInt8] {
        let w = Double(width), h = Double(height)
        var out = [UInt8]()
        out.reserveCapacity(64 * 1024 + tracks.reduce(0) { $0 + $1.points.count * 12 })
        func put(_ text: String) { out.append(contentsOf: text.utf8) }
        func px(_ value: Double) -> String { Decimal64.text(value, places: 1) }

        put("""
            <?xml version="1.0" encoding="UTF-8"?>
            <svg xmlns="http://www.w3.org/2000/svg" width="\(width)" height="\(height)" viewBox="0 0 \(width) \(height)" \
            font-family="sans-serif" font-size="13">
            <title>drivebus: \(tracks.count) drives</title>
            <rect width="\(width)" height="\(height)" fill="#f7f6f2"/>

            """)
        let totalKm = tracks.reduce(0) { $0 + ($1.trip.distanceM ?? 0) } / 1000
        put("<text x=\"12\" y=\"22\" fill=\"#333\">\(tracks.count) drives, \(Decimal64.text(totalKm, places: 1)) km</text>\n")

        guard let origin = tracks.first?.points.first else {
            put("<text x=\"\(width / 2)\" y=\"\(height / 2)\" text-anchor=\"middle\" fill=\"#888\">no drives in this range</text>\n</svg>\n")
            return out
        }
        // One local projection for all tracks, continuous across the antimeridian.
        let projection = LocalProjection(origin: origin)
        var minX = Double.infinity, maxX = -Double.infinity, minY = Double.infinity, maxY = -Double.infinity
        let projected: [[(x: Double, y: Double)]] = tracks.map { track in
            track.points.map { point in
                let p = projection.project(point)
                minX = min(minX, p.x); maxX = max(maxX, p.x)
                minY = min(minY, p.y); maxY = max(maxY, p.y)
                return p
            }
        }
        let margin = 24.0, top = 34.0, bottom = 40.0
        let spanX = max(maxX - minX, 1), spanY = max(maxY - minY, 1)
        let scale = max(1e-9, min((w - 2 * margin) / spanX, (h - top - bottom) / spanY))
        // Centred in the drawing area; y grows downwards in SVG.
        let offsetX = margin + (w - 2 * margin - spanX * scale) / 2
        let offsetY = top + (h - top - bottom - spanY * scale) / 2
        func screen(_ p: (x: Double, y: Double)) -> (Double, Double) {
            (offsetX + (p.x - minX) * scale, offsetY + (maxY - p.y) * scale)
        }

        for home in homes {
            let p = projection.project(home.center)
            guard p.x >= minX - spanX, p.x <= maxX + spanX, p.y >= minY - spanY, p.y <= maxY + spanY else { continue }
            let (x, y) = screen(p)
            put("<circle cx=\"\(px(x))\" cy=\"\(px(y))\" r=\"\(px(max(4, home.radiusM * scale)))\" fill=\"#2e86ab\" fill-opacity=\"0.25\" stroke=\"#2e86ab\"/>\n")
        }

        put("<g fill=\"none\" stroke=\"#c0392b\" stroke-opacity=\"0.55\" stroke-width=\"1.6\" stroke-linejoin=\"round\" stroke-linecap=\"round\">\n")
        for (track, points) in zip(tracks, projected) {
            put("<polyline data-trip=\"\(Markup.escape(track.trip.tripID))\" points=\"")
            var previous = ""
            var written = 0
            for point in points {
                let (x, y) = screen(point)
                let pair = px(x) + "," + px(y)
                // Points that land on the same tenth of a pixel add nothing.
                if pair == previous { continue }
                if written > 0 { out.append(UInt8(ascii: " ")) }
                put(pair)
                previous = pair
                written += 1
            }
            if written == 1 { put(" " + previous) }
            put("\"/>\n")
        }
        put("</g>\n")

        // A scale bar of a round length, at most a quarter of the width.
        let maxMetres = w / 4 / scale
        let magnitude = pow(10, floor(log10(maxMetres)))
        let metres = [5.0, 2, 1].map { $0 * magnitude }.first { $0 <= maxMetres } ?? magnitude
        let barPx = metres * scale
        let label = metres >= 1000 ? "\(Decimal64.text(metres / 1000)) km" : "\(Decimal64.text(metres)) m"
        let barY = h - 16
        put("""
            <g stroke="#333" stroke-width="2"><line x1="\(px(margin))" y1="\(px(barY))" x2="\(px(margin + barPx))" y2="\(px(barY))"/>\
            <line x1="\(px(margin))" y1="\(px(barY - 5))" x2="\(px(margin))" y2="\(px(barY + 1))"/>\
            <line x1="\(px(margin + barPx))" y1="\(px(barY - 5))" x2="\(px(margin + barPx))" y2="\(px(barY + 1))"/></g>
            <text x="\(px(margin + barPx + 8))" y="\(px(barY + 4))" fill="#333">\(label)</text>
            </svg>

            """)
        return out
    }
}
