import Foundation

/// A WGS 84 position in degrees.
public struct Coordinate: Sendable, Hashable, Codable {
    public var lat: Double
    public var lon: Double

    public init(lat: Double, lon: Double) {
        self.lat = lat
        self.lon = lon
    }
}

public enum Geo {
    /// The mean Earth radius (IUGG), in metres.
    public static let earthRadiusM = 6_371_008.8

    /// Great-circle distance in metres (haversine).
    @inlinable
    public static func distance(_ a: Coordinate, _ b: Coordinate) -> Double {
        let φ1 = a.lat * .pi / 180, φ2 = b.lat * .pi / 180
        let Δφ = φ2 - φ1
        let Δλ = normalizedLongitudeDelta(b.lon - a.lon) * .pi / 180
        let h = sin(Δφ / 2) * sin(Δφ / 2) + cos(φ1) * cos(φ2) * sin(Δλ / 2) * sin(Δλ / 2)
        return 2 * earthRadiusM * asin(min(1, h.squareRoot()))
    }

    /// Initial bearing from `a` to `b`, in degrees from 0 (north) up to 360.
    public static func bearing(from a: Coordinate, to b: Coordinate) -> Double {
        let φ1 = a.lat * .pi / 180, φ2 = b.lat * .pi / 180
        let Δλ = normalizedLongitudeDelta(b.lon - a.lon) * .pi / 180
        let y = sin(Δλ) * cos(φ2)
        let x = cos(φ1) * sin(φ2) - sin(φ1) * cos(φ2) * cos(Δλ)
        let degrees = atan2(y, x) * 180 / .pi
        return degrees < 0 ? degrees + 360 : degrees
    }

    /// A longitude difference folded into -180…180, so that the antimeridian is no edge.
    @inlinable
    public static func normalizedLongitudeDelta(_ delta: Double) -> Double {
        var d = delta.truncatingRemainder(dividingBy: 360)
        if d > 180 { d -= 360 } else if d < -180 { d += 360 }
        return d
    }
}

/// An equirectangular projection around an origin: metres east (`x`) and north (`y`). Accurate to
/// well under 1 % within tens of kilometres of the origin, which is what zones and trips need, and
/// continuous across the antimeridian.
public struct LocalProjection: Sendable, Equatable {
    public let origin: Coordinate
    private let metresPerDegreeLat: Double
    private let metresPerDegreeLon: Double

    public init(origin: Coordinate) {
        self.origin = origin
        metresPerDegreeLat = Geo.earthRadiusM * .pi / 180
        metresPerDegreeLon = metresPerDegreeLat * cos(origin.lat * .pi / 180)
    }

    @inlinable
    public func project(_ point: Coordinate) -> (x: Double, y: Double) {
        (Geo.normalizedLongitudeDelta(point.lon - origin.lon) * lonScale, (point.lat - origin.lat) * latScale)
    }

    public func unproject(x: Double, y: Double) -> Coordinate {
        var lon = origin.lon + x / metresPerDegreeLon
        if lon > 180 { lon -= 360 } else if lon < -180 { lon += 360 }
        return Coordinate(lat: origin.lat + y / metresPerDegreeLat, lon: lon)
    }

    @usableFromInline var lonScale: Double { metresPerDegreeLon }
    @usableFromInline var latScale: Double { metresPerDegreeLat }
}

/// Douglas-Peucker line simplification over a local metric projection, with an explicit stack
/// rather than recursion, so a track of any length cannot overflow the call stack.
public enum DouglasPeucker {
    /// The indices of the points kept, in order; the first and last are always kept.
    public static func simplify(_ points: [Coordinate], epsilonM: Double) -> [Int] {
        guard points.count > 2 else { return Array(points.indices) }
        let projection = LocalProjection(origin: points[points.count / 2])
        var xs = [Double](repeating: 0, count: points.count)
        var ys = [Double](repeating: 0, count: points.count)
        for (index, point) in points.enumerated() {
            (xs[index], ys[index]) = projection.project(point)
        }
        return simplify(xs: xs, ys: ys, epsilon: epsilonM)
    }

    /// The same on points of a plane, in any unit (`epsilon` in it): the map's tiles simplify
    /// in Web Mercator units. `xs` and `ys` have one entry per point.
    public static func simplify(xs: [Double], ys: [Double], epsilon: Double) -> [Int] {
        let count = min(xs.count, ys.count)
        guard count > 2 else { return Array(0..<count) }
        var keep = [Bool](repeating: false, count: count)
        keep[0] = true
        keep[count - 1] = true
        let epsilonSquared = epsilon * epsilon
        var stack: [(Int, Int)] = [(0, count - 1)]
        while let (first, last) = stack.popLast() {
            guard last - first > 1 else { continue }
            let ax = xs[first], ay = ys[first]
            let dx = xs[last] - ax, dy = ys[last] - ay
            let lengthSquared = dx * dx + dy * dy
            var farthest = first
            var farthestDistance = -1.0
            for index in (first + 1)..<last {
                let px = xs[index] - ax, py = ys[index] - ay
                let distanceSquared: Double
                if lengthSquared == 0 {
                    distanceSquared = px * px + py * py
                } else {
                    // Distance to the segment, not the infinite line: tracks double back.
                    let t = max(0, min(1, (px * dx + py * dy) / lengthSquared))
                    let ex = px - t * dx, ey = py - t * dy
                    distanceSquared = ex * ex + ey * ey
                }
                if distanceSquared > farthestDistance {
                    farthestDistance = distanceSquared
                    farthest = index
                }
            }
            if farthestDistance > epsilonSquared {
                keep[farthest] = true
                stack.append((first, farthest))
                stack.append((farthest, last))
            }
        }
        return keep.indices.filter { keep[$0] }
    }

    public static func simplified(_ points: [Coordinate], epsilonM: Double) -> [Coordinate] {
        simplify(points, epsilonM: epsilonM).map { points[$0] }
    }
}

/// A polygon of `[lat, lon]` vertices, tested in a local projection around its centroid.
public struct GeoPolygon: Sendable, Equatable {
    public let vertices: [Coordinate]
    public let projection: LocalProjection
    private let xs: [Double]
    private let ys: [Double]

    public init(_ vertices: [Coordinate]) {
        precondition(vertices.count >= 3, "a polygon needs 3 vertices")
        self.vertices = vertices
        // The centroid of the vertices, averaging longitudes across the antimeridian correctly.
        let first = vertices[0]
        let meanLon = first.lon + vertices.map { Geo.normalizedLongitudeDelta($0.lon - first.lon) }.reduce(0, +) / Double(vertices.count)
        let meanLat = vertices.map(\.lat).reduce(0, +) / Double(vertices.count)
        projection = LocalProjection(origin: Coordinate(lat: meanLat, lon: Geo.normalizedLongitudeDelta(meanLon)))
        let projected = vertices.map(projection.project)
        xs = projected.map(\.x)
        ys = projected.map(\.y)
    }

    /// Even-odd ray casting.
    public func contains(_ point: Coordinate) -> Bool {
        let (px, py) = projection.project(point)
        var inside = false
        var j = xs.count - 1
        for i in 0..<xs.count {
            if (ys[i] > py) != (ys[j] > py), px < (xs[j] - xs[i]) * (py - ys[i]) / (ys[j] - ys[i]) + xs[i] {
                inside.toggle()
            }
            j = i
        }
        return inside
    }

    /// Metres from `point` to the nearest edge.
    public func distanceToBoundary(_ point: Coordinate) -> Double {
        let (px, py) = projection.project(point)
        var best = Double.infinity
        var j = xs.count - 1
        for i in 0..<xs.count {
            let dx = xs[i] - xs[j], dy = ys[i] - ys[j]
            let lengthSquared = dx * dx + dy * dy
            let t = lengthSquared == 0 ? 0 : max(0, min(1, ((px - xs[j]) * dx + (py - ys[j]) * dy) / lengthSquared))
            let ex = px - (xs[j] + t * dx), ey = py - (ys[j] + t * dy)
            best = min(best, (ex * ex + ey * ey).squareRoot())
            j = i
        }
        return best
    }

    /// The radius of the largest circle inside the polygon, estimated on a grid: the accuracy rule
    /// compares a fix's accuracy with it, as with a circle's radius.
    public var inradiusM: Double {
        let minX = xs.min()!, maxX = xs.max()!, minY = ys.min()!, maxY = ys.max()!
        let steps = 40
        var best = 0.0
        for i in 0...steps {
            for j in 0...steps {
                let x = minX + (maxX - minX) * Double(i) / Double(steps)
                let y = minY + (maxY - minY) * Double(j) / Double(steps)
                let point = projection.unproject(x: x, y: y)
                if contains(point) { best = max(best, distanceToBoundary(point)) }
            }
        }
        return best
    }

    /// The bounding box, for spatial indexes.
    public var bounds: (minLat: Double, maxLat: Double, minLon: Double, maxLon: Double) {
        let lats = vertices.map(\.lat)
        let projected = zip(xs, ys).map { projection.unproject(x: $0, y: $1) }
        let lons = projected.map(\.lon)
        return (lats.min()!, lats.max()!, lons.min()!, lons.max()!)
    }
}

/// Total climb and descent of an altitude series with a hysteresis: a change counts only once
/// the altitude has moved `hysteresisM` from the last turning point, so GPS noise does not add up.
public struct AscentCounter: Sendable, Equatable {
    public let hysteresisM: Double
    public private(set) var ascentM = 0.0
    public private(set) var descentM = 0.0
    private var reference: Double?

    public init(hysteresisM: Double = 5) { self.hysteresisM = hysteresisM }

    public mutating func add(_ altitude: Double) {
        guard altitude.isFinite else { return }
        guard let base = reference else {
            reference = altitude
            return
        }
        let change = altitude - base
        if change >= hysteresisM {
            ascentM += change
            reference = altitude
        } else if change <= -hysteresisM {
            descentM -= change
            reference = altitude
        }
    }
}
