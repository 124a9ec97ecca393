/// drivebus-mqtt's `mqtt_status` RPC answer: whether it is connected, to which broker, and its
/// counters (`mqtt.received`, `mqtt.refused.<code>`…).
public struct MQTTStatus: Codable, Sendable, Equatable {
    public var connected: Bool
    public var broker: String
    public var counters: [String: UInt64]

    public init(connected: Bool, broker: String, counters: [String: UInt64]) {
        self.connected = connected
        self.broker = broker
        self.counters = counters
    }
}
