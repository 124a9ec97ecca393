import DrivebusSchema
import DrivebusSettings
import Foundation
import MQTTCore
import Yams

extension DrivebusConfig {
    /// The `mqtt:` section; nil when it is absent (drivebus-mqtt then does not run).
    static func parseMQTT(_ top: ConfigMapping, environment: [String: String]) throws(ConfigError) -> MQTTConfiguration? {
        guard top.has("mqtt") else { return nil }
        let section = try top.mapping("mqtt", allowed: [
            "broker", "client_id", "username", "password", "password_file", "password_env", "tls", "owntracks", "home_assistant",
            "topic_prefix", "max_payload_bytes",
        ])
        var mqtt = MQTTConfiguration()
        if section.has("tls") {
            if case .scalar? = section.node("tls") {
                mqtt.tls = try section.bool("tls", default: false) ? .init() : nil
            } else {
                let tls = try section.mapping("tls", allowed: ["ca_file", "cert_file", "key_file"])
                mqtt.tls = .init(caFile: try readablePath(tls, "ca_file"), certFile: try readablePath(tls, "cert_file"), keyFile: try readablePath(tls, "key_file"))
                if (mqtt.tls?.certFile == nil) != (mqtt.tls?.keyFile == nil) {
                    throw ConfigError(path: tls.keyPath("cert_file"), reason: "cert_file and key_file go together")
                }
            }
        }
        let broker = try parseListen(section, key: "broker", default: Listen(host: "127.0.0.1", port: mqtt.tls == nil ? 1883 : 8883))
        mqtt.host = broker.host
        mqtt.port = broker.port
        mqtt.clientID = try section.string("client_id", default: mqtt.clientID)
        guard (1...64).contains(mqtt.clientID.utf8.count) else { throw ConfigError(path: section.keyPath("client_id"), reason: "must be 1 to 64 bytes") }
        mqtt.username = try section.string("username")
        mqtt.password = try parsePassword(section, environment: environment)
        if mqtt.password != nil && mqtt.username == nil {
            throw ConfigError(path: section.keyPath("username"), reason: "is required with a password")
        }
        mqtt.topicPrefix = try topic(section, "topic_prefix", default: mqtt.topicPrefix)
        mqtt.maxPayloadBytes = try section.int("max_payload_bytes", default: mqtt.maxPayloadBytes, in: 1024...(1 << 20))
        let ownTracks = try section.mapping("owntracks", allowed: ["base_topic", "devices"])
        mqtt.ownTracks.baseTopic = try topic(ownTracks, "base_topic", default: mqtt.ownTracks.baseTopic)
        if ownTracks.has("devices") {
            guard case .mapping(let mapping)? = ownTracks.node("devices") else {
                throw ConfigError(path: ownTracks.keyPath("devices"), reason: "expected a mapping of \"<user>/<device>\" to a drivebus device")
            }
            for (key, value) in mapping {
                let path = ownTracks.keyPath("devices")
                guard let userDevice = key.string, userDevice.split(separator: "/", omittingEmptySubsequences: false).count == 2,
                      !userDevice.contains("+"), !userDevice.contains("#"), !userDevice.hasPrefix("/"), !userDevice.hasSuffix("/") else {
                    throw ConfigError(path: path, reason: "keys are \"<user>/<device>\" as in the app's topic, got \"\(key.string ?? "?")\"")
                }
                guard let device = value.string, DeviceID.isValid(device) else {
                    throw ConfigError(path: ConfigMapping.join(path, userDevice), reason: "expected a drivebus device id")
                }
                mqtt.ownTracks.devices[userDevice] = device
            }
        }
        if section.has("home_assistant") {
            if case .scalar? = section.node("home_assistant") {
                mqtt.homeAssistant = try section.bool("home_assistant", default: true) ? .init() : nil
            } else {
                let homeAssistant = try section.mapping("home_assistant", allowed: ["discovery_prefix"])
                mqtt.homeAssistant = .init()
                mqtt.homeAssistant?.discoveryPrefix = try topic(homeAssistant, "discovery_prefix", default: "homeassistant")
            }
        }
        return mqtt
    }

    /// A topic (or topic prefix) without wildcards or empty levels.
    private static func topic(_ section: ConfigMapping, _ key: String, default value: String) throws(ConfigError) -> String {
        let topic = try section.string(key, default: value)
        guard !topic.isEmpty, !topic.contains("+"), !topic.contains("#"), !topic.hasPrefix("/"), !topic.hasSuffix("/"), !topic.contains("//"),
              topic.utf8.count <= 200 else {
            throw ConfigError(path: section.keyPath(key), reason: "expected a topic without wildcards or empty levels, got \"\(topic)\"")
        }
        return topic
    }

    private static func readablePath(_ section: ConfigMapping, _ key: String) throws(ConfigError) -> String? {
        guard let path = try section.string(key) else { return nil }
        guard FileManager.default.isReadableFile(atPath: path) else { throw ConfigError(path: section.keyPath(key), reason: "cannot read \(path)") }
        return path
    }

    /// At most one of password, password_file (its first line) or password_env. Never echoed.
    private static func parsePassword(_ section: ConfigMapping, environment: [String: String]) throws(ConfigError) -> String? {
        let given = ["password", "password_file", "password_env"].filter(section.has)
        guard given.count <= 1 else { throw ConfigError(path: section.keyPath(given[1]), reason: "give only one of password, password_file and password_env") }
        if let password = try section.string("password") { return password }
        if let file = try section.string("password_file") {
            guard let data = FileManager.default.contents(atPath: file), let text = String(data: data, encoding: .utf8) else {
                throw ConfigError(path: section.keyPath("password_file"), reason: "cannot read \(file)")
            }
            let line = text.split(separator: "\n", maxSplits: 1, omittingEmptySubsequences: false).first ?? ""
            return String(line.hasSuffix("\r") ? line.dropLast() : line)
        }
        if let name = try section.string("password_env") {
            guard let value = environment[name] else { throw ConfigError(path: section.keyPath("password_env"), reason: "the environment has no \(name)") }
            return value
        }
        return nil
    }
}
