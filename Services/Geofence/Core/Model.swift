import DrivebusGeo
import DrivebusSchema
import Foundation

/// A zone ready for testing fixes against.
struct CompiledZone: Sendable {
    enum Geometry: Sendable {
        case circle(center: Coordinate, radiusM: Double)
        case polygon(GeoPolygon)
        /// A zone the engine cannot use (it fails validation): it contains nothing.
        case unusable
    }

    let id: String
    let geometry: Geometry
    /// A fix less accurate than this changes nothing for the zone: the radius, or the inradius.
    let accuracyLimitM: Double
    /// Covers every point the zone contains; what the spatial index holds.
    let box: GeoBox

    init(_ zone: Zone) {
        id = zone.id
        guard Self.problem(with: zone.shape) == nil else {
            (geometry, accuracyLimitM, box) = (.unusable, 0, .empty)
            return
        }
        switch zone.shape {
        case .circle(let center, let radiusM):
            geometry = .circle(center: center, radiusM: radiusM)
            accuracyLimitM = radiusM
            box = GeoBox(around: center, radiusM: radiusM)
        case .polygon(let vertices):
            let polygon = GeoPolygon(vertices)
            geometry = .polygon(polygon)
            accuracyLimitM = polygon.inradiusM
            box = GeoBox(around: polygon)
        }
    }

    func contains(_ point: Coordinate) -> Bool {
        switch geometry {
        case .circle(let center, let radiusM): Geo.distance(center, point) <= radiusM
        case .polygon(let polygon): polygon.contains(point)
        case .unusable: false
        }
    }

    /// More than `hysteresisM` outside: where a device inside exits.
    func isBeyond(_ point: Coordinate, hysteresisM: Double) -> Bool {
        switch geometry {
        case .circle(let center, let radiusM): Geo.distance(center, point) > radiusM + hysteresisM
        case .polygon(let polygon): !polygon.contains(point) && polygon.distanceToBoundary(point) > hysteresisM
        case .unusable: true
        }
    }

    /// Why a shape cannot be used, with the key it is about, or `nil`.
    static func problem(with shape: Zone.Shape) -> (key: String, reason: String)? {
        func valid(_ point: Coordinate) -> Bool {
            point.lat.isFinite && point.lon.isFinite && abs(point.lat) <= 90 && abs(point.lon) <= 180
        }
        switch shape {
        case .circle(let center, let radiusM):
            guard valid(center) else { return ("circle", "lat must be -90…90 and lon -180…180") }
            guard radiusM.isFinite, radiusM > 0, radiusM <= 1_000_000 else { return ("circle.radius_m", "expected more than 0 and at most 1000000 metres") }
        case .polygon(let vertices):
            guard (3...10_000).contains(vertices.count) else { return ("polygon", "expected 3 to 10000 [lat, lon] vertices") }
            if let bad = vertices.firstIndex(where: { !valid($0) }) {
                return ("polygon[\(bad)]", "lat must be -90…90 and lon -180…180")
            }
            guard vertices.allSatisfy({ abs($0.lat) < 89 }) else { return ("polygon", "must stay clear of the poles") }
            // The local projection is accurate within tens of kilometres.
            let polygon = GeoPolygon(vertices)
            let projected = vertices.map(polygon.projection.project)
            guard projected.allSatisfy({ ($0.x * $0.x + $0.y * $0.y).squareRoot() <= 100_000 }) else {
                return ("polygon", "must lie within 100 km of its centre")
            }
            var area2 = 0.0
            for index in projected.indices {
                let a = projected[index], b = projected[(index + 1) % projected.count]
                area2 += a.x * b.y - b.x * a.y
            }
            guard abs(area2) > 1 else { return ("polygon", "has no area") }
        }
        return nil
    }
}

struct CompiledGate: Sendable {
    let gate: Gate
    /// -1 when the gate's zone does not exist.
    let zone: Int
    let devices: Set<String>?
    let method: String
    let url: Template
    let body: Template
    let bodyMode: Template.Mode
    /// The webhook's headers, with `Content-Type` added for a JSON body that has none.
    let headers: [String: String]
    let usable: Bool

    init(_ gate: Gate, zone: Int) {
        self.gate = gate
        self.zone = zone
        devices = gate.devices.map(Set.init)
        method = gate.webhook.method.uppercased()
        url = Template(gate.webhook.url)
        let hasBody = method != "GET" && method != "HEAD"
        body = Template(hasBody ? gate.webhook.body : "")
        let contentType = gate.webhook.headers.first { $0.key.lowercased() == "content-type" }?.value
        bodyMode = Template.bodyMode(body: gate.webhook.body, contentType: contentType)
        var headers = gate.webhook.headers
        if hasBody, contentType == nil, bodyMode == .json { headers["Content-Type"] = "application/json" }
        self.headers = headers
        usable = zone >= 0 && gate.cooldownS.isFinite && gate.maxAgeS.isFinite
    }
}

/// The immutable part of an engine: compiled zones, gates and the spatial index. A class so that
/// copies of an engine (snapshots) share it.
final class GeofenceModel: Sendable {
    let configuration: GeofenceConfiguration
    let zones: [CompiledZone]
    let zoneByID: [String: Int]
    let gates: [CompiledGate]
    let gateByID: [String: Int]
    let gatesByZone: [[Int]]
    /// `nil` scans every zone: only for comparing against the index.
    let index: ZoneIndex?
    let hysteresisM: Double
    let minDwellS: Double

    init(_ configuration: GeofenceConfiguration, spatialIndex: Bool) {
        self.configuration = configuration
        zones = configuration.zones.map(CompiledZone.init)
        var zoneByID: [String: Int] = [:]
        for (index, zone) in zones.enumerated() where zoneByID[zone.id] == nil { zoneByID[zone.id] = index }
        self.zoneByID = zoneByID
        gates = configuration.gates.map { CompiledGate($0, zone: zoneByID[$0.zone] ?? -1) }
        var gateByID: [String: Int] = [:]
        var gatesByZone = [[Int]](repeating: [], count: zones.count)
        for (index, gate) in gates.enumerated() where gate.usable && gateByID[gate.gate.id] == nil {
            gateByID[gate.gate.id] = index
            gatesByZone[gate.zone].append(index)
        }
        self.gateByID = gateByID
        self.gatesByZone = gatesByZone
        index = spatialIndex ? ZoneIndex(boxes: zones.map(\.box)) : nil
        // Out-of-range thresholds fall back to the defaults rather than breaking the arithmetic.
        hysteresisM = configuration.hysteresisM.isFinite && configuration.hysteresisM >= 0 ? configuration.hysteresisM : 20
        minDwellS = configuration.minDwellS.isFinite && configuration.minDwellS >= 0 ? configuration.minDwellS : 300
    }
}
