import Foundation

/// A named area, a circle or a polygon. Codable as in the YAML:
/// `{id: home, circle: {lat: 56.95, lon: 24.10, radius_m: 100}}` or `{id: parking, polygon: [[lat, lon], …]}`.
public struct Zone: Sendable, Equatable, Codable {
    public enum Shape: Sendable, Equatable {
        case circle(center: Coordinate, radiusM: Double)
        /// Vertices in order; the ring closes itself. Tested in a local metric projection.
        case polygon([Coordinate])
    }

    /// `[A-Za-z0-9_-]{1,64}`, like device ids, because it goes into event ids.
    public var id: String
    public var shape: Shape
    /// For the scorer's speeding check inside this zone; the geofence and stats ignore it.
    public var speedLimitKmh: Double?

    public init(id: String, shape: Shape, speedLimitKmh: Double? = nil) {
        self.id = id
        self.shape = shape
        self.speedLimitKmh = speedLimitKmh
    }

    enum CodingKeys: String, CodingKey {
        case id, circle, polygon
        case speedLimitKmh = "speed_limit_kmh"
    }

    private struct Circle: Codable {
        var lat: Double
        var lon: Double
        var radiusM: Double
        enum CodingKeys: String, CodingKey {
            case lat, lon
            case radiusM = "radius_m"
        }
    }

    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        id = try container.decode(String.self, forKey: .id)
        speedLimitKmh = try container.decodeIfPresent(Double.self, forKey: .speedLimitKmh)
        let circle = try container.decodeIfPresent(Circle.self, forKey: .circle)
        let polygon = try container.decodeIfPresent([[Double]].self, forKey: .polygon)
        switch (circle, polygon) {
        case (let circle?, nil):
            shape = .circle(center: Coordinate(lat: circle.lat, lon: circle.lon), radiusM: circle.radiusM)
        case (nil, let pairs?):
            guard pairs.allSatisfy({ $0.count == 2 }) else {
                throw DecodingError.dataCorruptedError(forKey: .polygon, in: container, debugDescription: "expected [lat, lon] pairs")
            }
            shape = .polygon(pairs.map { Coordinate(lat: $0[0], lon: $0[1]) })
        default:
            throw DecodingError.dataCorruptedError(forKey: .circle, in: container, debugDescription: "a zone has exactly one of circle and polygon")
        }
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(id, forKey: .id)
        switch shape {
        case .circle(let center, let radiusM):
            try container.encode(Circle(lat: center.lat, lon: center.lon, radiusM: radiusM), forKey: .circle)
        case .polygon(let vertices):
            try container.encode(vertices.map { [$0.lat, $0.lon] }, forKey: .polygon)
        }
        try container.encodeIfPresent(speedLimitKmh, forKey: .speedLimitKmh)
    }
}

extension Zone {
    /// The circle that stands for the zone where one is needed (time away from home, the map):
    /// a circle's own, or the polygon's largest inscribed circle.
    public var circle: (center: Coordinate, radiusM: Double) {
        switch shape {
        case .circle(let center, let radiusM): (center, radiusM)
        case .polygon(let vertices):
            { polygon in (polygon.projection.origin, polygon.inradiusM) }(GeoPolygon(vertices))
        }
    }
}
