import DrivebusGeo
import DrivebusSchema
import DrivebusTrackFormats
import Foundation

/// One alternative route as posted: GPX `trk`/`rte` or a GeoJSON LineString.
public struct RouteInput: Sendable, Equatable {
    public struct Point: Sendable, Equatable {
        public var coordinate: Coordinate
        public var elevationM: Double?
        public init(_ coordinate: Coordinate, elevationM: Double?) {
            self.coordinate = coordinate
            self.elevationM = elevationM
        }
    }

    public var name: String
    public var points: [Point]

    public init(name: String, points: [Point]) {
        self.name = name
        self.points = points
    }
}

/// A route measured and ranked: flattest first.
public struct RankedRoute: Sendable, Equatable {
    public var name: String
    /// Its position in the body, from 0.
    public var index: Int
    /// 1 for the flattest.
    public var rank: Int
    /// `#rrggbb`, green for the flattest through yellow and orange to red.
    public var rankColor: String
    public var distanceM: Double
    /// From the posted points only, with the trips' hysteresis (see `RouteRanking.rank`).
    public var ascentM: Double
    public var descentM: Double
    /// The steepest grade, up or down, over any `gradeWindowM` of the route.
    public var maxGradePct: Double
    /// The route densified: consecutive points at most `spacingM` apart.
    public var points: [Coordinate]
    /// The elevation of each point (interpolated between posted ones).
    public var elevationsM: [Double]
    /// The distance along the route of each point: with `elevationsM`, the profile.
    public var distancesM: [Double]
}

/// Ranks alternative routes by how much climbing they involve (`POST /api/v1/routes/rank`).
///
/// Flattest means least total ascent; equal ascents (to 0.1 m) go by the steepest 40 m, then the
/// shorter distance, then the order posted.
public struct RouteRanking: Sendable, Equatable {
    /// The same as the trips service's `trips.ascent_hysteresis_m`, so that a route's `ascent_m`
    /// agrees with a trip's over the same points.
    public var ascentHysteresisM: Double
    /// No two points of the densified route are further apart than this.
    public var spacingM: Double
    /// The distance `max_grade_pct` is measured over.
    public var gradeWindowM: Double
    /// The most points all densified routes of one request may have.
    public var maxPoints: Int

    public init(ascentHysteresisM: Double = 5, spacingM: Double = 40, gradeWindowM: Double = 40, maxPoints: Int = 2_000_000) {
        self.ascentHysteresisM = ascentHysteresisM
        self.spacingM = spacingM
        self.gradeWindowM = gradeWindowM
        self.maxPoints = maxPoints
    }

    public static let maxRoutes = 100

    // MARK: Reading

    /// Routes from GPX 1.1 (every `trk` and `rte`; a track's segments are joined) or GeoJSON
    /// (LineStrings and MultiLineStrings with `[lon, lat, ele]`), told apart by the first byte,
    /// read by `DrivebusTrackFormats`: what it refuses is a 400 naming the route and point, or
    /// the line.
    public static func read(_ body: [UInt8]) throws(StatsError) -> [RouteInput] {
        guard let format = TrackFormat(sniffing: body) else {
            throw invalidBody("expected GPX 1.1 or a GeoJSON FeatureCollection of LineStrings")
        }
        let routes = try read(TrackReader(format: format, bytes: body, limits: TrackLimits(maxGeoJSONBytes: maxGeoJSONBytes)))
        guard !routes.isEmpty else {
            throw StatsError(status: 422, code: "stats.no_routes", message: "body: has no routes (GPX trk or rte, GeoJSON LineString)", field: "body")
        }
        return routes
    }

    /// The most points all routes of one body may have, before densifying.
    static let maxPostedPoints = 1_000_000

    /// GeoJSON is parsed whole, so a body of it is taken up to 4 MiB (some 150,000 positions);
    /// GPX streams, up to the body limit. A 16 MiB LineString took stats to 820 MB before it was
    /// refused for its point count.
    public static let maxGeoJSONBytes = 4 << 20

    static func read(_ reader: TrackReader) throws(StatsError) -> [RouteInput] {
        var routes: [RouteInput] = []
        var points: [RouteInput.Point] = []
        var total = 0
        do {
            while let event = try reader.next() {
                switch event {
                case .point(let point):
                    guard point.track != nil else { continue }  // waypoints and GeoJSON Points are not routes
                    total += 1
                    guard total <= maxPostedPoints else { throw invalidBody("at most \(maxPostedPoints) points") }
                    points.append(.init(Coordinate(lat: point.lat, lon: point.lon), elevationM: point.elevationM))
                case .track(let track):
                    routes.append(RouteInput(name: track.name ?? "route \(track.index + 1)", points: points))
                    points = []
                    guard routes.count <= maxRoutes else { throw invalidBody("at most \(maxRoutes) routes at once") }
                case .activity, .visit:
                    continue
                }
            }
        } catch let error as TrackFormatError {
            if let track = error.track, let point = error.point {
                throw invalidPoint(route: error.trackName ?? "route \(track + 1)", point: point, error.message)
            }
            throw invalidBody(error.description)
        } catch let error as StatsError {
            throw error
        } catch {
            throw invalidBody("\(error)")
        }
        return routes
    }

    static func invalidBody(_ message: String) -> StatsError {
        StatsError(status: 400, code: "stats.invalid_body", message: "body: " + message, field: "body")
    }

    static func invalidPoint(route: String, point: Int, _ message: String) -> StatsError {
        StatsError(
            status: 400, code: "stats.invalid_body", message: "route \"\(route)\" point \(point): \(message)", field: "body",
            details: ["route": .string(route), "point": .number(Double(point))])
    }

    // MARK: Ranking

    /// Measures and ranks; 422 `stats.no_elevation` naming the first route without elevation,
    /// 422 `stats.invalid_route` for one with fewer than two points.
    public func rank(_ routes: [RouteInput]) throws(StatsError) -> [RankedRoute] {
        let spacing = max(1, spacingM.isFinite ? spacingM : 40)
        // Rounding the output to 7 decimals moves a point by under 1 cm: keep that much margin.
        let step = spacing - 0.05
        var total = 0.0
        for (index, route) in routes.enumerated() {
            func refuse(_ code: String, _ message: String) -> StatsError {
                StatsError(
                    status: 422, code: code, message: "route \"\(route.name)\" " + message, field: "route",
                    details: ["route": .string(route.name), "index": .number(Double(index))])
            }
            guard route.points.count >= 2 else { throw refuse("stats.invalid_route", "needs at least two points") }
            guard route.points.contains(where: { $0.elevationM != nil }) else {
                throw refuse("stats.no_elevation", "has no elevation: each point needs GPX <ele> or a third GeoJSON coordinate")
            }
            for (a, b) in zip(route.points, route.points.dropFirst()) {
                total += (Geo.distance(a.coordinate, b.coordinate) / step).rounded(.up) + 1
            }
        }
        guard total <= Double(maxPoints) else {
            throw StatsError(status: 422, code: "stats.invalid_route", message: "body: the routes are too long: over \(maxPoints) points every \(Decimal64.text(spacing)) m", field: "body")
        }

        var measured = routes.enumerated().map { index, route in measure(route, index: index, step: step) }
        measured.sort { a, b in
            let keyA = (Self.tenth(a.ascentM), Self.tenth(a.maxGradePct), a.distanceM, a.index)
            let keyB = (Self.tenth(b.ascentM), Self.tenth(b.maxGradePct), b.distanceM, b.index)
            return keyA < keyB
        }
        for position in measured.indices {
            measured[position].rank = position + 1
            measured[position].rankColor = Self.color(rank: position, of: measured.count)
        }
        return measured
    }

    static func tenth(_ value: Double) -> Double { (value * 10).rounded() / 10 }

    private func measure(_ route: RouteInput, index: Int, step: Double) -> RankedRoute {
        let posted = route.points
        // Along-route distance of each posted point, for filling in missing elevations.
        var along = [0.0]
        along.reserveCapacity(posted.count)
        for (a, b) in zip(posted, posted.dropFirst()) { along.append(along.last! + Geo.distance(a.coordinate, b.coordinate)) }
        let elevations = Self.filled(posted.map(\.elevationM), along: along)

        // Ascent as the trips service counts it: the posted elevations, in order, through the
        // same hysteresis. Densified points are left out on purpose: the counter depends on the
        // sampling, and only the posted points are what a recorded trip would have had.
        var ascent = AscentCounter(hysteresisM: ascentHysteresisM)
        for point in posted { if let elevation = point.elevationM { ascent.add(elevation) } }

        var points: [Coordinate] = [posted[0].coordinate]
        var heights: [Double] = [elevations[0]]
        var distances: [Double] = [0]
        for i in 1..<posted.count {
            let a = posted[i - 1].coordinate, b = posted[i].coordinate
            let length = along[i] - along[i - 1]
            let pieces = max(1, Int((length / step).rounded(.up)))
            for piece in 1...pieces {
                let t = Double(piece) / Double(pieces)
                points.append(piece == pieces ? b : Self.interpolate(a, b, t))
                heights.append(elevations[i - 1] + (elevations[i] - elevations[i - 1]) * t)
                distances.append(along[i - 1] + length * t)
            }
        }
        return RankedRoute(
            name: route.name, index: index, rank: 0, rankColor: "", distanceM: along.last!, ascentM: ascent.ascentM,
            descentM: ascent.descentM, maxGradePct: Self.maxGrade(distances: distances, elevations: heights, window: max(1, gradeWindowM)),
            points: points, elevationsM: heights, distancesM: distances)
    }

    /// Missing elevations interpolated by distance between the nearest known ones; before the
    /// first or after the last known one, that one.
    static func filled(_ values: [Double?], along: [Double]) -> [Double] {
        let known = values.indices.filter { values[$0] != nil }
        var out = [Double](repeating: 0, count: values.count)
        var next = 0
        for i in values.indices {
            if let value = values[i] {
                out[i] = value
                next += (next < known.count && known[next] == i) ? 1 : 0
                continue
            }
            let before = next > 0 ? known[next - 1] : nil
            let after = next < known.count ? known[next] : nil
            switch (before, after) {
            case let (b?, a?):
                let span = along[a] - along[b]
                let t = span > 0 ? (along[i] - along[b]) / span : 0
                out[i] = values[b]! + (values[a]! - values[b]!) * t
            case let (b?, nil): out[i] = values[b]!
            case let (nil, a?): out[i] = values[a]!
            case (nil, nil): out[i] = 0
            }
        }
        return out
    }

    /// A point a fraction `t` along the great circle from `a` to `b`: equal fractions are equal
    /// distances, so the spacing holds on long segments and across the antimeridian.
    static func interpolate(_ a: Coordinate, _ b: Coordinate, _ t: Double) -> Coordinate {
        func vector(_ c: Coordinate) -> (Double, Double, Double) {
            let φ = c.lat * .pi / 180, λ = c.lon * .pi / 180
            return (cos(φ) * cos(λ), cos(φ) * sin(λ), sin(φ))
        }
        let p = vector(a), q = vector(b)
        let dot = max(-1, min(1, p.0 * q.0 + p.1 * q.1 + p.2 * q.2))
        let ω = acos(dot)
        guard ω > 1e-12, sin(ω) > 1e-12 else { return a }
        let wa = sin((1 - t) * ω) / sin(ω), wb = sin(t * ω) / sin(ω)
        let x = wa * p.0 + wb * q.0, y = wa * p.1 + wb * q.1, z = wa * p.2 + wb * q.2
        return Coordinate(lat: atan2(z, (x * x + y * y).squareRoot()) * 180 / .pi, lon: atan2(y, x) * 180 / .pi)
    }

    /// The steepest |Δelevation| / window over any stretch of `window` metres, in percent. The
    /// profile is piecewise linear, so the steepest stretch starts or ends at one of its points;
    /// a route shorter than the window is measured end to end.
    static func maxGrade(distances: [Double], elevations: [Double], window: Double) -> Double {
        guard let length = distances.last, length > 0 else { return 0 }
        if length < window { return abs(elevations.last! - elevations.first!) / length * 100 }
        func elevation(at x: Double) -> Double {
            // The first point at or beyond x, by bisection.
            var low = 0, high = distances.count - 1
            while low < high {
                let middle = (low + high) / 2
                if distances[middle] < x { low = middle + 1 } else { high = middle }
            }
            guard low > 0 else { return elevations[0] }
            let span = distances[low] - distances[low - 1]
            let t = span > 0 ? (x - distances[low - 1]) / span : 1
            return elevations[low - 1] + (elevations[low] - elevations[low - 1]) * t
        }
        var steepest = 0.0
        let slack = 1e-9 * length
        for i in distances.indices {
            if distances[i] + window <= length + slack {
                steepest = max(steepest, abs(elevation(at: min(length, distances[i] + window)) - elevations[i]))
            }
            if distances[i] - window >= -slack {
                steepest = max(steepest, abs(elevations[i] - elevation(at: max(0, distances[i] - window))))
            }
        }
        return steepest / window * 100
    }

    /// Green (flattest) through yellow and orange to red (steepest), spread over the ranks.
    static func color(rank: Int, of count: Int) -> String {
        let stops: [(Double, Double, Double)] = [(26, 152, 80), (230, 190, 20), (242, 130, 30), (215, 48, 39)]
        let t = count > 1 ? Double(rank) / Double(count - 1) : 0
        let position = t * Double(stops.count - 1)
        let lower = min(stops.count - 2, Int(position)), f = position - Double(lower)
        let a = stops[lower], b = stops[lower + 1]
        func hex(_ x: Double, _ y: Double) -> String {
            let value = Int((x + (y - x) * f).rounded())
            let digits = Array("0123456789abcdef")
            return String([digits[value / 16], digits[value % 16]])
        }
        return "#" + hex(a.0, b.0) + hex(a.1, b.1) + hex(a.2, b.2)
    }

    // MARK: Output

    /// `{"count", "routes": [...]}`, flattest first. Distances, elevations and grades to 0.1,
    /// coordinates to 7 decimals (1 cm).
    public func json(_ ranked: [RankedRoute]) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(1024 + ranked.reduce(0) { $0 + $1.points.count * 48 })
        func put(_ text: String) { out.append(contentsOf: text.utf8) }
        func tenth(_ value: Double) -> String { Decimal64.text(value, places: 1) }
        func string(_ text: String) -> String {
            var writer = JSONWriter()
            writer.string(text)
            return String(decoding: writer.bytes, as: UTF8.self)
        }
        put("{\"ascent_hysteresis_m\":\(Decimal64.text(ascentHysteresisM)),\"count\":\(ranked.count),")
        put("\"grade_window_m\":\(Decimal64.text(gradeWindowM)),\"routes\":[")
        for (position, route) in ranked.enumerated() {
            if position > 0 { put(",") }
            put("\n{\"ascent_m\":\(tenth(route.ascentM)),\"coordinates\":[")
            for i in route.points.indices {
                if i > 0 { put(",") }
                put("[\(Decimal64.text(route.points[i].lon, places: 7)),\(Decimal64.text(route.points[i].lat, places: 7)),\(tenth(route.elevationsM[i]))]")
            }
            put("],\"descent_m\":\(tenth(route.descentM)),\"distance_m\":\(tenth(route.distanceM)),\"index\":\(route.index),")
            put("\"max_grade_pct\":\(tenth(route.maxGradePct)),\"name\":\(string(route.name)),\"profile\":[")
            for i in route.distancesM.indices {
                if i > 0 { put(",") }
                put("[\(tenth(route.distancesM[i])),\(tenth(route.elevationsM[i]))]")
            }
            put("],\"rank\":\(route.rank),\"rank_color\":\"\(route.rankColor)\"}")
        }
        put("\n],\"spacing_m\":\(Decimal64.text(spacingM))}\n")
        return out
    }

    /// All elevation profiles in one chart, in their rank colours, with axes in metres.
    public func svg(_ ranked: [RankedRoute], width: Int = 960, height: Int = 480) -> [UInt8] {
        Array(Charts.profiles(ranked, width: Double(width), height: Double(height), standalone: true).utf8)
    }
}
