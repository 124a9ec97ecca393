import Foundation

/// OwnTracks in MQTT mode: which topics to subscribe to, and which drivebus device a message is
/// for. The payload itself is decoded by ingest, exactly as an HTTP POST would be.
public enum OwnTracksTopics {
    /// A message that passed the checks ingest cannot make: a known device, a sane size.
    public struct Routed: Sendable, Equatable {
        public var device: String
        public var payload: String
        public init(device: String, payload: String) {
            self.device = device
            self.payload = payload
        }
    }

    /// Why a message is refused before it reaches ingest. `code` is counted.
    public struct Refusal: Error, Sendable, Equatable, CustomStringConvertible {
        public var code: String
        public var field: String
        public var message: String
        public var description: String { "\(field): \(message)" }
    }

    /// Locations and lwt on `<base>/<user>/<device>`, transitions on `…/event`. The app's other
    /// subtopics (`cmd`, `info`, `waypoints`…) carry no fixes and are not subscribed to.
    public static func filters(_ configuration: MQTTConfiguration) -> [String] {
        let base = configuration.ownTracks.baseTopic
        return ["\(base)/+/+", "\(base)/+/+/event"]
    }

    /// `"<user>/<device>"` of a topic under the base, or nil for a topic that is not OwnTracks'.
    public static func userDevice(_ topic: String, baseTopic: String) -> String? {
        guard topic.hasPrefix(baseTopic + "/") else { return nil }
        var parts = topic.dropFirst(baseTopic.count + 1).split(separator: "/", omittingEmptySubsequences: false)
        if parts.count == 3, parts[2] == "event" { parts.removeLast() }
        guard parts.count == 2, !parts[0].isEmpty, !parts[1].isEmpty else { return nil }
        return parts.joined(separator: "/")
    }

    /// The device a message is for: by the configured map when there is one, else by the
    /// topic's device part. With a map, a topic it does not list is refused: the device part
    /// alone would let any broker user who may publish under the base post as any device (one
    /// phone posting as the car, and opening its gate).
    public static func route(
        topic: String, payload: [UInt8], configuration: MQTTConfiguration, knownDevices: Set<String>
    ) -> Result<Routed, Refusal> {
        guard let userDevice = userDevice(topic, baseTopic: configuration.ownTracks.baseTopic) else {
            return .failure(Refusal(code: "mqtt.unknown_topic", field: "topic", message: "not an OwnTracks topic under \(configuration.ownTracks.baseTopic)/"))
        }
        let map = configuration.ownTracks.devices
        guard map.isEmpty || map[userDevice] != nil else {
            return .failure(Refusal(
                code: "mqtt.unlisted_topic", field: "topic",
                message: "\(userDevice) is not listed under mqtt.owntracks.devices (once one topic is, every phone's must be)"))
        }
        let device = map[userDevice] ?? String(userDevice.split(separator: "/")[1])
        guard knownDevices.contains(device) else {
            return .failure(Refusal(
                code: "mqtt.unknown_device", field: "topic",
                message: "\(userDevice) maps to no drivebus device (list it under mqtt.owntracks.devices)"))
        }
        guard payload.count <= configuration.maxPayloadBytes else {
            return .failure(Refusal(
                code: "mqtt.too_large", field: "payload",
                message: "\(payload.count) bytes, larger than the limit of \(configuration.maxPayloadBytes)"))
        }
        guard let text = String(validating: payload, as: UTF8.self) else {
            return .failure(Refusal(code: "mqtt.not_utf8", field: "payload", message: "is not UTF-8 JSON"))
        }
        return .success(Routed(device: device, payload: text))
    }
}
