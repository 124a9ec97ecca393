import Foundation

/// The `mqtt:` section of the config. drivebus-mqtt runs only when it is present.
public struct MQTTConfiguration: Sendable, Equatable {
    public struct TLS: Sendable, Equatable {
        public var caFile: String?
        public var certFile: String?
        public var keyFile: String?
        public init(caFile: String? = nil, certFile: String? = nil, keyFile: String? = nil) {
            self.caFile = caFile
            self.certFile = certFile
            self.keyFile = keyFile
        }
    }

    public struct OwnTracks: Sendable, Equatable {
        /// The app's base topic: it publishes to `<base>/<user>/<device>`.
        public var baseTopic = "owntracks"
        /// `"<user>/<device>"` → drivebus device. A topic not listed maps to the drivebus device
        /// named like its `<device>` part, if there is one.
        public var devices: [String: String] = [:]
        public init() {}
    }

    public struct HomeAssistant: Sendable, Equatable {
        public var discoveryPrefix = "homeassistant"
        public init() {}
    }

    public var host = "127.0.0.1"
    public var port = 1883
    public var clientID = "drivebus"
    public var username: String?
    /// From `password`, `password_file` or `password_env`; never logged.
    public var password: String?
    public var tls: TLS?
    public var ownTracks = OwnTracks()
    /// nil: no discovery messages.
    public var homeAssistant: HomeAssistant? = HomeAssistant()
    /// States, events and availability go under it (`drivebus/status`, `drivebus/car/location`…).
    public var topicPrefix = "drivebus"
    /// Larger OwnTracks messages are refused (the HTTP path's limit for one message).
    public var maxPayloadBytes = 64 * 1024
    /// How often today's figures are asked of the stats service.
    public var todayRefreshS = 60.0

    public init() {}

    /// `prefix/status`: `online` while drivebus-mqtt is connected, `offline` otherwise (its will).
    public var availabilityTopic: String { topicPrefix + "/status" }
}

extension MQTTConfiguration: CustomStringConvertible {
    /// For logs: never the password.
    public var description: String {
        "mqtt://\(username.map { $0 + "@" } ?? "")\(host):\(port) client \(clientID)\(tls == nil ? "" : " tls")"
    }
}
