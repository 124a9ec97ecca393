import Foundation

/// `geofence.enter|exit|dwell.<device>`: a device crossed into, out of, or stayed in a zone.
///
/// Derived from fixes alone, so re-processing the journal yields the same events.
public struct GeofenceTransition: Codable, Sendable, Equatable {
    public enum Event: String, Codable, Sendable, CaseIterable {
        case enter, exit, dwell
    }

    public var device: String
    public var zone: String
    public var event: Event
    /// The fix's time. For `dwell`, the moment the dwell was reached: the entering fix's time
    /// plus `min_dwell_s`, the same whether a later fix or the clock decided it.
    public var time: Date
    public var lat: Double
    public var lon: Double
    /// The fix's journal seq. For `dwell`, that of the last fix inside at or before `time`.
    public var seq: UInt64?
    /// Only for `dwell`: how long the device had been inside at `time`.
    public var dwellS: Double?
    /// True when the fix at `seq` came from `drivebus import`: a crossing in a history, not one
    /// happening now (it never opens a gate, and Home Assistant's zone states ignore it).
    /// Absent for a live fix.
    public var imported: Bool?

    public init(
        device: String, zone: String, event: Event, time: Date, lat: Double, lon: Double, seq: UInt64?, dwellS: Double? = nil, imported: Bool? = nil
    ) {
        self.device = device
        self.zone = zone
        self.event = event
        self.time = time
        self.lat = lat
        self.lon = lon
        self.seq = seq
        self.dwellS = dwellS
        self.imported = imported
    }

    enum CodingKeys: String, CodingKey {
        case device, zone, event, time, lat, lon, seq, imported
        case dwellS = "dwell_s"
    }
}

/// `gate.fired.<device>`: a gate's webhook was delivered. Never carries the webhook's secret,
/// URL credentials or headers.
public struct GateFired: Codable, Sendable, Equatable {
    public var gate: String
    public var device: String
    public var zone: String
    /// The triggering fix's journal seq.
    public var seq: UInt64?
    /// Stable for the gate and the triggering fix; sent as `Idempotency-Key`.
    public var idempotencyKey: String
    /// The receiver's HTTP status.
    public var status: Int
    /// How long the successful attempt took.
    public var latencyMs: Double
    /// Attempts made, the successful one included.
    public var attempts: Int
    /// When the call succeeded.
    public var time: Date

    public init(gate: String, device: String, zone: String, seq: UInt64?, idempotencyKey: String, status: Int, latencyMs: Double, attempts: Int, time: Date) {
        self.gate = gate
        self.device = device
        self.zone = zone
        self.seq = seq
        self.idempotencyKey = idempotencyKey
        self.status = status
        self.latencyMs = latencyMs
        self.attempts = attempts
        self.time = time
    }

    enum CodingKeys: String, CodingKey {
        case gate, device, zone, seq, status, attempts, time
        case idempotencyKey = "idempotency_key"
        case latencyMs = "latency_ms"
    }
}

/// `gate.failed.<device>`: a gate's webhook was given up on after its last attempt, or at the
/// first answer that retrying cannot fix (a 4xx other than 429).
public struct GateFailed: Codable, Sendable, Equatable {
    public var gate: String
    public var device: String
    public var zone: String
    public var seq: UInt64?
    public var idempotencyKey: String
    /// The last HTTP status, when there was an answer at all.
    public var status: Int?
    /// A short reason (`timeout`, `connection refused`, `HTTP 500`); never a secret.
    public var error: String
    public var attempts: Int
    /// When the last attempt ended.
    public var time: Date

    public init(gate: String, device: String, zone: String, seq: UInt64?, idempotencyKey: String, status: Int?, error: String, attempts: Int, time: Date) {
        self.gate = gate
        self.device = device
        self.zone = zone
        self.seq = seq
        self.idempotencyKey = idempotencyKey
        self.status = status
        self.error = error
        self.attempts = attempts
        self.time = time
    }

    enum CodingKeys: String, CodingKey {
        case gate, device, zone, seq, status, error, attempts, time
        case idempotencyKey = "idempotency_key"
    }
}
