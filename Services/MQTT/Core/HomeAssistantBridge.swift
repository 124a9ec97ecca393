import DrivebusSchema
import Foundation

/// One message for the broker.
public struct Publication: Sendable, Equatable, CustomStringConvertible {
    public var topic: String
    public var payload: String
    public var qos: Int32
    public var retain: Bool

    public init(_ topic: String, _ payload: String, qos: Int32, retain: Bool) {
        self.topic = topic
        self.payload = payload
        self.qos = qos
        self.retain = retain
    }

    public var description: String { "\(topic) \(retain ? "(retained) " : "")\(payload)" }
}

/// What drivebus tells MQTT: Home Assistant's discovery configs, the states behind them, and a
/// copy of the bus's events for everyone else. Bus payloads in, publications out.
///
/// Topic classes (`p` is `mqtt.topic_prefix`, `d` a device, `z` a zone):
/// - `p/status`: `online`/`offline`, QoS 1, retained (and the will);
/// - `<discovery>/…/drivebus_<d>/…/config`: QoS 1, retained; empty to remove an entity;
/// - states `p/<d>/location|battery|trip|zone/<z>|last_trip|last_score|today`: retained, so
///   Home Assistant has them after its own restart. Location and battery QoS 0 (the next fix
///   follows), the others QoS 1;
/// - events `p/<d>/gate|checkout` for Home Assistant's event entities, and
///   `p/events/<type>/<d>` (the bus payload as it is): QoS 1, not retained.
public struct HomeAssistantBridge: Sendable {
    public struct Device: Sendable, Equatable {
        public var id: String
        /// Its home zone, if it has one: only then is there a time-away sensor.
        public var home: String?
        public init(id: String, home: String? = nil) {
            self.id = id
            self.home = home
        }
    }

    /// Bus topic prefixes of the events the bridge passes on.
    public static let eventPrefixes = ["trip.", "device.", "geofence.", "gate.", "taxi.checkout.", "drive."]

    /// Positions come in ingest's journal pages, as they come to every journal follower: a
    /// subscriber of `fix.` would make ingest publish a message per fix as well (docs/events.md).
    /// Returns the pages' live fixes in order: not their other records, and not imported
    /// history, which is not where a device is now. A page that cannot be read gives nothing
    /// and is counted.
    public static func liveFixes(inPages pages: [BusMessage]) -> (fixes: [(busTopic: String, payload: [UInt8])], unreadablePages: Int) {
        var fixes: [(busTopic: String, payload: [UInt8])] = []
        var unreadable = 0
        for page in pages {
            guard let records = try? JournalPage.records(in: page) else {
                unreadable += 1
                continue
            }
            for record in records where record.topic.hasPrefix("fix.") && (try? BusJSON.decode(Fix.self, from: record.payload))?.source != .import {
                fixes.append((record.topic, record.payload))
            }
        }
        return (fixes, unreadable)
    }

    public let configuration: MQTTConfiguration
    public let zones: [String]

    public init(configuration: MQTTConfiguration, zones: [String]) {
        self.configuration = configuration
        self.zones = zones
    }

    private var prefix: String { configuration.topicPrefix }

    public func online() -> Publication { Publication(configuration.availabilityTopic, "online", qos: 1, retain: true) }
    public func offline() -> Publication { Publication(configuration.availabilityTopic, "offline", qos: 1, retain: true) }

    // MARK: Discovery

    /// Every entity's config for these devices; nothing when discovery is off.
    public func discovery(_ devices: [Device]) -> [Publication] {
        guard let discovery = configuration.homeAssistant else { return [] }
        return devices.flatMap { device in entities(device).map { entity in
            Publication(
                "\(discovery.discoveryPrefix)/\(entity.component)/drivebus_\(device.id)/\(entity.objectID)/config",
                Self.json(entity.config.merging(common(device, objectID: entity.objectID)) { own, _ in own }), qos: 1, retain: true)
        } }
    }

    /// Empty retained configs for the topics published before and not now: Home Assistant then
    /// removes those entities.
    public static func removals(previous: Set<String>, current: [Publication]) -> [Publication] {
        let now = Set(current.map(\.topic))
        return previous.subtracting(now).sorted().map { Publication($0, "", qos: 1, retain: true) }
    }

    private struct Entity {
        let component: String
        let objectID: String
        let config: [String: Any]
    }

    private func entities(_ device: Device) -> [Entity] {
        let state = "\(prefix)/\(device.id)"
        var entities = [
            Entity(component: "device_tracker", objectID: "location", config: [
                "name": NSNull(), "json_attributes_topic": "\(state)/location", "source_type": "gps",
            ]),
            Entity(component: "sensor", objectID: "battery", config: [
                "name": "Battery", "state_topic": "\(state)/battery", "device_class": "battery", "unit_of_measurement": "%",
                "state_class": "measurement",
            ]),
            Entity(component: "binary_sensor", objectID: "trip", config: [
                "name": "Trip in progress", "state_topic": "\(state)/trip", "device_class": "moving",
            ]),
            Entity(component: "sensor", objectID: "last_trip_distance", config: [
                "name": "Last trip distance", "state_topic": "\(state)/last_trip", "value_template": "{{ value_json.distance_km }}",
                "unit_of_measurement": "km", "device_class": "distance", "json_attributes_topic": "\(state)/last_trip",
            ]),
            Entity(component: "sensor", objectID: "last_trip_duration", config: [
                "name": "Last trip duration", "state_topic": "\(state)/last_trip", "value_template": "{{ value_json.duration_s }}",
                "unit_of_measurement": "s", "device_class": "duration",
            ]),
            Entity(component: "sensor", objectID: "last_trip_score", config: [
                "name": "Last trip score", "state_topic": "\(state)/last_score", "value_template": "{{ value_json.score }}",
                "json_attributes_topic": "\(state)/last_score", "icon": "mdi:steering",
            ]),
            Entity(component: "sensor", objectID: "today_distance", config: [
                "name": "Distance today", "state_topic": "\(state)/today", "value_template": "{{ value_json.distance_km }}",
                "unit_of_measurement": "km", "device_class": "distance", "state_class": "total_increasing",
            ]),
            Entity(component: "event", objectID: "gate", config: [
                "name": "Gate", "state_topic": "\(state)/gate", "event_types": ["fired", "failed"], "icon": "mdi:gate",
            ]),
            Entity(component: "event", objectID: "checkout", config: [
                "name": "Taxi check-out", "state_topic": "\(state)/checkout", "event_types": ["checkout"], "icon": "mdi:taxi",
            ]),
        ]
        if device.home != nil {
            entities.append(Entity(component: "sensor", objectID: "today_away", config: [
                "name": "Away from home today", "state_topic": "\(state)/today", "value_template": "{{ value_json.away_s }}",
                "unit_of_measurement": "s", "device_class": "duration",
            ]))
        }
        for zone in zones {
            entities.append(Entity(component: "binary_sensor", objectID: "zone_\(Self.topicLevel(zone))", config: [
                "name": "In \(zone)", "state_topic": "\(state)/zone/\(Self.topicLevel(zone))", "device_class": "presence",
            ]))
        }
        return entities
    }

    private func common(_ device: Device, objectID: String) -> [String: Any] {
        [
            "unique_id": "drivebus_\(device.id)_\(objectID)",
            "availability_topic": configuration.availabilityTopic,
            "device": ["identifiers": ["drivebus_\(device.id)"], "name": device.id, "manufacturer": "drivebus"],
            "origin": ["name": "drivebus"],
        ]
    }

    // MARK: States and events

    /// What a bus event changes. Events other than fixes are also copied under `p/events/`.
    public func publications(busTopic: String, payload: [UInt8]) -> [Publication] {
        let parts = busTopic.split(separator: ".")
        guard parts.count >= 2, let fields = (try? JSONSerialization.jsonObject(with: Data(payload))) as? [String: Any] else { return [] }
        let device = String(parts.last!)
        let type = parts.dropLast().joined(separator: ".")
        let state = "\(prefix)/\(device)"
        var out: [Publication] = []
        // An event of an imported history says what happened then, not what happens now: it is
        // copied under `p/events/`, but no state changes for it.
        let imported = fields["imported"] as? Bool == true
        switch type {
        case "fix":
            return location(fields, state: state)
        case _ where imported:
            break
        case "trip.started":
            out.append(Publication("\(state)/trip", "ON", qos: 1, retain: true))
        case "trip.ended":
            out.append(Publication("\(state)/trip", "OFF", qos: 1, retain: true))
            var trip: [String: Any] = [:]
            trip["trip_id"] = fields["trip_id"]
            trip["distance_km"] = (fields["distance_m"] as? Double).map { Self.rounded($0 / 1000, places: 2) }
            trip["duration_s"] = fields["duration_s"]
            trip["start_time"] = fields["start_time"]
            trip["end_time"] = fields["end_time"]
            out.append(Publication("\(state)/last_trip", Self.json(trip), qos: 1, retain: true))
        case "drive.scored":
            var score: [String: Any] = [:]
            for key in ["trip_id", "score", "events_per_100km", "speeding_s", "end_time"] { score[key] = fields[key] }
            out.append(Publication("\(state)/last_score", Self.json(score), qos: 1, retain: true))
        case "geofence.enter", "geofence.exit":
            if let zone = fields["zone"] as? String {
                out.append(Publication("\(state)/zone/\(Self.topicLevel(zone))", type == "geofence.enter" ? "ON" : "OFF", qos: 1, retain: true))
            }
        case "gate.fired", "gate.failed":
            var event: [String: Any] = ["event_type": type == "gate.fired" ? "fired" : "failed"]
            for key in ["gate", "zone", "status", "attempts", "time", "error"] { event[key] = fields[key] }
            out.append(Publication("\(state)/gate", Self.json(event), qos: 1, retain: false))
        case "taxi.checkout":
            var event: [String: Any] = ["event_type": "checkout"]
            for key in ["checkout_time", "reason", "confidence", "ride_s", "ride_distance_m"] { event[key] = fields[key] }
            out.append(Publication("\(state)/checkout", Self.json(event), qos: 1, retain: false))
        default:
            break
        }
        out.append(Publication("\(prefix)/events/\(parts.joined(separator: "/"))", String(decoding: payload, as: UTF8.self), qos: 1, retain: false))
        return out
    }

    /// What a group of bus events that arrived together changes. Of a device's fixes only the
    /// last one's position is published: under a flood the broker gets the newest state, not a
    /// backlog of stale ones; one at a time, every fix is published at once.
    public func publications(_ events: [(busTopic: String, payload: [UInt8])]) -> [Publication] {
        var lastFix: [Substring: Int] = [:]
        for (index, event) in events.enumerated() where event.busTopic.hasPrefix("fix.") {
            lastFix[event.busTopic.dropFirst(4)] = index
        }
        var out: [Publication] = []
        for (index, event) in events.enumerated() {
            if event.busTopic.hasPrefix("fix."), lastFix[event.busTopic.dropFirst(4)] != index { continue }
            out += publications(busTopic: event.busTopic, payload: event.payload)
        }
        return out
    }

    /// The device tracker reads latitude, longitude and gps_accuracy from the attributes.
    private func location(_ fields: [String: Any], state: String) -> [Publication] {
        guard let lat = fields["lat"] as? Double, let lon = fields["lon"] as? Double else { return [] }
        var attributes: [String: Any] = ["latitude": lat, "longitude": lon]
        attributes["gps_accuracy"] = fields["accuracy_m"]
        attributes["altitude"] = fields["altitude_m"]
        attributes["speed_kmh"] = (fields["speed_mps"] as? Double).map { Self.rounded($0 * 3.6, places: 1) }
        attributes["course"] = fields["course_deg"]
        attributes["time"] = fields["time"]
        var out = [Publication("\(state)/location", Self.json(attributes), qos: 0, retain: true)]
        if let battery = fields["battery"] as? Double, battery >= 0 {
            out.append(Publication("\(state)/battery", String(Int((battery * 100).rounded())), qos: 0, retain: true))
        }
        return out
    }

    /// Whether an event may change today's distance or time away.
    public static func changesToday(busTopic: String) -> Bool {
        busTopic.hasPrefix("trip.ended.") || busTopic.hasPrefix("geofence.enter.") || busTopic.hasPrefix("geofence.exit.")
    }

    /// Today's figures from the stats service's `/api/v1/stats/daily` for one device (UTC day).
    /// `awayS` is nil for a device without a home.
    public func today(device: String, date: String, distanceM: Double, awayS: Double?) -> Publication {
        var today: [String: Any] = ["date": date, "distance_km": Self.rounded(distanceM / 1000, places: 2)]
        today["away_s"] = awayS.map { $0.rounded() }
        return Publication("\(prefix)/\(device)/today", Self.json(today), qos: 1, retain: true)
    }

    /// A zone id as a topic level and a Home Assistant object id: anything but letters, digits,
    /// `-` and `_` (a `+`, `#`, `/` or space) becomes `_`.
    public static func topicLevel(_ id: String) -> String {
        String(id.unicodeScalars.map { scalar in
            scalar.isASCII && (CharacterSet.alphanumerics.contains(scalar) || scalar == "-" || scalar == "_") ? Character(scalar) : "_"
        })
    }

    // MARK: JSON

    static func rounded(_ value: Double, places: Int) -> Double {
        let scale = pow(10, Double(places))
        return (value * scale).rounded() / scale
    }

    /// Keys sorted by code point and written here. `JSONSerialization`'s `.sortedKeys` compares
    /// them by locale, through ICU, whose data then stays resident (3 MB of the bridge at rest)
    /// though nothing else in it needs ICU. Leaves are still written by `JSONSerialization`.
    static func json(_ object: [String: Any]) -> String {
        var out = ""
        write(object, to: &out)
        return out
    }

    private static func write(_ value: Any, to out: inout String) {
        switch value {
        case let object as [String: Any]:
            out += "{"
            for (index, key) in object.keys.sorted().enumerated() {
                if index > 0 { out += "," }
                write(key, to: &out)
                out += ":"
                write(object[key]!, to: &out)
            }
            out += "}"
        case let array as [Any]:
            out += "["
            for (index, element) in array.enumerated() {
                if index > 0 { out += "," }
                write(element, to: &out)
            }
            out += "]"
        default:
            let data = try? JSONSerialization.data(withJSONObject: value, options: [.fragmentsAllowed, .withoutEscapingSlashes])
            out += data.map { String(decoding: $0, as: UTF8.self) } ?? "null"
        }
    }
}
