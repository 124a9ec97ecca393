import DrivebusGeo
import DrivebusSchema
import Foundation

/// Where and how a gate calls out. The secret and header values never appear in descriptions,
/// reflection or events.
public struct Webhook: Sendable, Equatable, Codable {
    /// `http` or `https`. May hold the template fields, which are percent-encoded.
    public var url: String
    public var method: String
    /// Sent as given. `Content-Type: application/json` is added for a JSON body without one.
    public var headers: [String: String]
    /// The body template: `{{gate}}`, `{{device}}`, `{{zone}}`, `{{time}}`, `{{lat}}`, `{{lon}}`,
    /// `{{speed_mps}}`. Values are JSON-escaped when the body is JSON, percent-encoded when it is
    /// a form. Ignored for GET and HEAD.
    public var body: String
    /// The HMAC-SHA256 key for `X-Drivebus-Signature`; the core never uses it.
    public var secret: String?
    public var timeoutS: Double
    public var retries: Int

    public static let defaultBody = #"{"gate":"{{gate}}","device":"{{device}}","zone":"{{zone}}","time":"{{time}}","lat":{{lat}},"lon":{{lon}}}"#

    public init(url: String, method: String = "POST", headers: [String: String] = [:], body: String = Webhook.defaultBody, secret: String? = nil, timeoutS: Double = 5, retries: Int = 100) {
        self.url = url
        self.method = method
        self.headers = headers
        self.body = body
        self.secret = secret
        self.timeoutS = timeoutS
        self.retries = retries
    }

    enum CodingKeys: String, CodingKey {
        case url, method, headers, body, secret, retries
        case timeoutS = "timeout_s"
    }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        self.init(
            url: try c.decode(String.self, forKey: .url),
            method: try c.decodeIfPresent(String.self, forKey: .method) ?? "POST",
            headers: try c.decodeIfPresent([String: String].self, forKey: .headers) ?? [:],
            body: try c.decodeIfPresent(String.self, forKey: .body) ?? Webhook.defaultBody,
            secret: try c.decodeIfPresent(String.self, forKey: .secret),
            timeoutS: try c.decodeIfPresent(Double.self, forKey: .timeoutS) ?? 5,
            retries: try c.decodeIfPresent(Int.self, forKey: .retries) ?? 100)
    }
}

extension Webhook: CustomStringConvertible, CustomDebugStringConvertible, CustomReflectable {
    public var description: String {
        let headerNames = headers.keys.sorted().map { "\($0): <redacted>" }.joined(separator: ", ")
        return "Webhook(\(method) \(Redact.url(url)), headers: [\(headerNames)], body: \(body.utf8.count) bytes, "
            + "secret: \(secret == nil ? "none" : "<redacted>"), timeout_s: \(timeoutS), retries: \(retries))"
    }

    public var debugDescription: String { description }

    public var customMirror: Mirror {
        Mirror(self, children: ["description": description], displayStyle: .struct)
    }
}

/// One rule that opens a gate: a webhook called when an allowed device enters (or exits) a zone.
public struct Gate: Sendable, Equatable, Codable {
    public enum Trigger: String, Sendable, Codable, CaseIterable {
        case enter, exit
    }

    public var id: String
    /// The zone's id.
    public var zone: String
    /// `nil` for every device.
    public var devices: [String]?
    public var on: Trigger
    /// Reported speed, or else derived from the device's previous fix; no speed known, no call.
    public var minSpeedMps: Double?
    /// Required activity of the motion sample in effect at the fix's time (`automotive`).
    public var motion: MotionSample.Activity?
    /// No second call for the same device within this many seconds (by fix time) of the last.
    public var cooldownS: Double
    /// No call for a fix older than this relative to `now`.
    public var maxAgeS: Double
    public var webhook: Webhook

    public init(
        id: String, zone: String, devices: [String]? = nil, on: Trigger = .enter, minSpeedMps: Double? = nil,
        motion: MotionSample.Activity? = nil, cooldownS: Double = 300, maxAgeS: Double = 120, webhook: Webhook
    ) {
        self.id = id
        self.zone = zone
        self.devices = devices
        self.on = on
        self.minSpeedMps = minSpeedMps
        self.motion = motion
        self.cooldownS = cooldownS
        self.maxAgeS = maxAgeS
        self.webhook = webhook
    }

    enum CodingKeys: String, CodingKey {
        case id, zone, devices, on, motion, webhook
        case minSpeedMps = "min_speed_mps"
        case cooldownS = "cooldown_s"
        case maxAgeS = "max_age_s"
    }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        self.init(
            id: try c.decode(String.self, forKey: .id),
            zone: try c.decode(String.self, forKey: .zone),
            devices: try c.decodeIfPresent([String].self, forKey: .devices),
            on: try c.decodeIfPresent(Trigger.self, forKey: .on) ?? .enter,
            minSpeedMps: try c.decodeIfPresent(Double.self, forKey: .minSpeedMps),
            motion: try c.decodeIfPresent(MotionSample.Activity.self, forKey: .motion),
            cooldownS: try c.decodeIfPresent(Double.self, forKey: .cooldownS) ?? 300,
            maxAgeS: try c.decodeIfPresent(Double.self, forKey: .maxAgeS) ?? 120,
            webhook: try c.decode(Webhook.self, forKey: .webhook))
    }
}

/// Everything the geofence core is configured with. In the YAML, `zones:` and `gates:` are
/// top-level lists and the thresholds are `geofence.hysteresis_m` and `geofence.min_dwell_s`.
public struct GeofenceConfiguration: Sendable, Equatable, Codable {
    public var zones: [Zone]
    public var gates: [Gate]
    /// A device inside a zone exits only when a fix is more than this far outside it.
    public var hysteresisM: Double
    /// Dwell fires once per visit after this long inside.
    public var minDwellS: Double

    public init(zones: [Zone] = [], gates: [Gate] = [], hysteresisM: Double = 20, minDwellS: Double = 300) {
        self.zones = zones
        self.gates = gates
        self.hysteresisM = hysteresisM
        self.minDwellS = minDwellS
    }

    enum CodingKeys: String, CodingKey {
        case zones, gates
        case hysteresisM = "hysteresis_m"
        case minDwellS = "min_dwell_s"
    }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        self.init(
            zones: try c.decodeIfPresent([Zone].self, forKey: .zones) ?? [],
            gates: try c.decodeIfPresent([Gate].self, forKey: .gates) ?? [],
            hysteresisM: try c.decodeIfPresent(Double.self, forKey: .hysteresisM) ?? 20,
            minDwellS: try c.decodeIfPresent(Double.self, forKey: .minDwellS) ?? 300)
    }
}

/// A configuration the geofence refuses, with the YAML key path (`gates[0].webhook.url`).
public struct GeofenceConfigurationError: Error, Sendable, Equatable, CustomStringConvertible {
    public let path: String
    public let reason: String

    public init(path: String, reason: String) {
        self.path = path
        self.reason = reason
    }

    public var code: String { "geofence.config" }
    public var description: String { "\(path): \(reason)" }
}

extension GeofenceConfiguration {
    /// Checks everything the engine relies on. The engine never crashes on a configuration that
    /// fails this, but ignores the zones and gates it cannot use.
    public func validate() throws(GeofenceConfigurationError) {
        func fail(_ path: String, _ reason: String) -> GeofenceConfigurationError {
            GeofenceConfigurationError(path: path, reason: reason)
        }
        guard hysteresisM.isFinite, (0...10_000).contains(hysteresisM) else {
            throw fail("geofence.hysteresis_m", "expected 0 to 10000 metres")
        }
        guard minDwellS.isFinite, (0...(30 * 86_400)).contains(minDwellS) else {
            throw fail("geofence.min_dwell_s", "expected 0 to 2592000 seconds")
        }
        var zoneIDs = Set<String>()
        for (index, zone) in zones.enumerated() {
            let path = "zones[\(index)]"
            guard DeviceID.isValid(zone.id) else { throw fail("\(path).id", "must match [A-Za-z0-9_-]{1,64}, got \"\(zone.id)\"") }
            guard zoneIDs.insert(zone.id).inserted else { throw fail("\(path).id", "zone \"\(zone.id)\" is listed twice") }
            if let limit = zone.speedLimitKmh, !(limit.isFinite && limit > 0 && limit <= 500) {
                throw fail("\(path).speed_limit_kmh", "expected more than 0 and at most 500")
            }
            if let problem = CompiledZone.problem(with: zone.shape) {
                throw fail("\(path).\(problem.key)", problem.reason)
            }
        }
        var gateIDs = Set<String>()
        for (index, gate) in gates.enumerated() {
            let path = "gates[\(index)]"
            guard DeviceID.isValid(gate.id) else { throw fail("\(path).id", "must match [A-Za-z0-9_-]{1,64}, got \"\(gate.id)\"") }
            guard gateIDs.insert(gate.id).inserted else { throw fail("\(path).id", "gate \"\(gate.id)\" is listed twice") }
            guard zoneIDs.contains(gate.zone) else { throw fail("\(path).zone", "no zone has the id \"\(gate.zone)\"") }
            if let devices = gate.devices {
                guard !devices.isEmpty else { throw fail("\(path).devices", "is empty; leave it out for every device") }
                if let bad = devices.first(where: { !DeviceID.isValid($0) }) {
                    throw fail("\(path).devices", "\"\(bad)\" is not a device id ([A-Za-z0-9_-]{1,64})")
                }
            }
            if let speed = gate.minSpeedMps, !(speed.isFinite && speed >= 0 && speed <= 100) {
                throw fail("\(path).min_speed_mps", "expected 0 to 100")
            }
            guard gate.cooldownS.isFinite, (0...(7 * 86_400)).contains(gate.cooldownS) else {
                throw fail("\(path).cooldown_s", "expected 0 to 604800 seconds")
            }
            guard gate.maxAgeS.isFinite, gate.maxAgeS > 0, gate.maxAgeS <= 86_400 else {
                throw fail("\(path).max_age_s", "expected more than 0 and at most 86400 seconds")
            }
            try gate.webhook.validate(path: "\(path).webhook")
        }
    }
}

extension Webhook {
    static let methods: Set<String> = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"]
    /// Set by the delivery itself.
    static let reservedHeaders: Set<String> = ["idempotency-key", "x-drivebus-signature", "content-length", "host", "transfer-encoding"]

    func validate(path: String) throws(GeofenceConfigurationError) {
        func fail(_ key: String, _ reason: String) -> GeofenceConfigurationError {
            GeofenceConfigurationError(path: "\(path).\(key)", reason: reason)
        }
        // The URL is never echoed: it may carry a token.
        let urlTemplate = Template(url)
        if let unknown = urlTemplate.unknownFields.first { throw fail("url", "unknown template field {{\(unknown)}}") }
        let sample = urlTemplate.render(Template.Values(gate: "g", device: "d", zone: "z", time: "t", lat: 0, lon: 0, speedMps: 0), mode: .url)
        guard let parsed = URLComponents(string: sample), let scheme = parsed.scheme?.lowercased(), ["http", "https"].contains(scheme),
              let host = parsed.host, !host.isEmpty
        else { throw fail("url", "expected an http:// or https:// URL with a host") }
        guard Self.methods.contains(method.uppercased()) else {
            throw fail("method", "expected one of \(Self.methods.sorted().joined(separator: ", ")), got \"\(method)\"")
        }
        var seen = Set<String>()
        for (name, value) in headers.sorted(by: { $0.key < $1.key }) {
            let token = !name.isEmpty && name.utf8.allSatisfy { byte in
                (0x21...0x7E).contains(byte) && !"()<>@,;:\\\"/[]?={}".utf8.contains(byte)
            }
            guard token else { throw fail("headers", "\"\(name)\" is not a header name") }
            guard !Self.reservedHeaders.contains(name.lowercased()) else { throw fail("headers", "\(name) is set by drivebus itself") }
            guard seen.insert(name.lowercased()).inserted else { throw fail("headers", "\(name) is given twice") }
            guard !value.utf8.contains(where: { $0 == 0x0D || $0 == 0x0A || $0 == 0 }) else {
                throw fail("headers", "the value of \(name) has a line break")  // the value itself is never echoed
            }
        }
        if let unknown = Template(body).unknownFields.first { throw fail("body", "unknown template field {{\(unknown)}}") }
        if let secret, secret.isEmpty { throw fail("secret", "is empty; leave it out for unsigned calls") }
        guard timeoutS.isFinite, timeoutS > 0, timeoutS <= 300 else { throw fail("timeout_s", "expected more than 0 and at most 300 seconds") }
        guard (0...100).contains(retries) else { throw fail("retries", "expected 0 to 100") }
    }
}

/// Keeps secrets out of descriptions: a URL shows only its scheme, host and port.
enum Redact {
    static func url(_ text: String) -> String {
        guard let components = URLComponents(string: text), let scheme = components.scheme, let host = components.host else {
            return "<url>"
        }
        let port = components.port.map { ":\($0)" } ?? ""
        let rest = components.path.isEmpty && components.query == nil ? "" : "/…"
        return "\(scheme)://\(host)\(port)\(rest)"
    }
}
