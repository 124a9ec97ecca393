import DrivebusGeo
import DrivebusSchema
import Foundation

public enum GeofenceInput: Sendable, Equatable {
    /// A fix; `live` says whether it may open a gate. The service passes false for a fix from
    /// `drivebus import`, whether it arrives off the bus or by replay.
    case fix(Fix, live: Bool)
    case motion(MotionSample)
    /// The clock, every few seconds: gives a device that stopped reporting inside a zone its dwell.
    case tick(now: Date)
}

/// One webhook call a gate asks for. Persist it in the outbox before the first attempt and send
/// exactly this; sign `body` and send `idempotencyKey` as `Idempotency-Key`.
public struct GateCall: Sendable, Equatable, Codable {
    public var gate: String
    public var device: String
    public var zone: String
    public var fixSeq: UInt64?
    /// `<gate>:<device>:<fix seq>`: stable for the gate and the triggering fix.
    public var idempotencyKey: String
    /// Template fields rendered, percent-encoded.
    public var url: String
    /// Upper case.
    public var method: String
    public var headers: [String: String]
    /// The rendered body; empty for GET and HEAD.
    public var body: String
    /// The triggering fix's time.
    public var time: Date
    /// What the templates were filled with.
    public var values: GateValues

    public init(
        gate: String, device: String, zone: String, fixSeq: UInt64?, idempotencyKey: String, url: String, method: String, headers: [String: String],
        body: String, time: Date, values: GateValues
    ) {
        self.gate = gate
        self.device = device
        self.zone = zone
        self.fixSeq = fixSeq
        self.idempotencyKey = idempotencyKey
        self.url = url
        self.method = method
        self.headers = headers
        self.body = body
        self.time = time
        self.values = values
    }

    enum CodingKeys: String, CodingKey {
        case gate, device, zone, url, method, headers, body, time, values
        case fixSeq = "fix_seq"
        case idempotencyKey = "idempotency_key"
    }
}

extension GateCall: CustomStringConvertible, CustomDebugStringConvertible, CustomReflectable {
    /// Header values and the URL's path and query may hold secrets: they are left out.
    public var description: String {
        "GateCall(\(idempotencyKey), zone: \(zone), \(method) \(Redact.url(url)), headers: [\(headers.keys.sorted().joined(separator: ", "))], body: \(body.utf8.count) bytes)"
    }

    public var debugDescription: String { description }

    public var customMirror: Mirror {
        Mirror(self, children: ["description": description], displayStyle: .struct)
    }
}

public enum GeofenceOutput: Sendable, Equatable {
    /// Publish as `geofence.<event>.<device>`.
    case transition(GeofenceTransition)
    /// Put in the outbox and deliver; `gate.fired|failed` follow from the delivery.
    case gate(GateCall)

    /// `geofence.enter|exit|dwell`, or `gate.call` (not a bus topic).
    public var type: String {
        switch self {
        case .transition(let transition): "geofence.\(transition.event.rawValue)"
        case .gate: "gate.call"
        }
    }

    public var device: String {
        switch self {
        case .transition(let transition): transition.device
        case .gate(let call): call.device
        }
    }

    /// Derived from the inputs, so re-processing yields the same id:
    /// `geofence.enter:<device>:<zone>:<fix seq>`, or the call's idempotency key. `:` appears in
    /// no device, zone or gate id, so ids cannot run into each other.
    public var eventID: String {
        switch self {
        case .transition(let t): "\(type):\(t.device):\(t.zone):\(GeofenceEngine.fixKey(seq: t.seq, time: t.time.timeIntervalSince1970))"
        case .gate(let call): call.idempotencyKey
        }
    }
}

/// The geofence as a state machine over all devices: fixes, motion samples and clock ticks in,
/// transitions and gate calls out. No I/O and no clock of its own.
///
/// Determinism: enter, exit and the fix-decided dwell are a pure function of the fix sequence.
/// A tick adds only the dwell of a device that has sent nothing for `min_dwell_s` (by `now`)
/// while inside, and that dwell's payload and id are exactly what a later fix would have
/// produced (time = entry + `min_dwell_s`, position of the last fix inside by then), so whether
/// the clock or a fix decided it, stores see one event. Gate calls also depend on `now` and
/// `live`, by design.
///
/// Codable is the checkpoint: device states and `lastSeq`, not the configuration (which holds
/// secrets). Decode with `decoder.userInfo = CheckpointConfiguration.userInfo(configuration)`;
/// state for zones and gates that are no longer configured is dropped.
public struct GeofenceEngine: Sendable, Codable {
    private let model: GeofenceModel
    private var devices: [DeviceState] = []
    private var deviceSlots: [String: Int] = [:]
    /// The slot of the last fix's device: a stream is mostly one device at a time.
    private var recentSlot = -1
    /// Fixes and motion samples with a journal seq at or below this are ignored.
    public private(set) var lastSeq: UInt64 = 0
    /// Reused for index queries, so a fix allocates nothing when nothing happens.
    private var candidates: [Int32] = []

    public init(configuration: GeofenceConfiguration) {
        self.init(configuration: configuration, spatialIndex: true)
    }

    /// `spatialIndex: false` tests every zone for every fix, to check and measure the index.
    @_spi(Testing)
    public init(configuration: GeofenceConfiguration, spatialIndex: Bool) {
        model = GeofenceModel(configuration, spatialIndex: spatialIndex)
        candidates.reserveCapacity(16)
    }

    public var configuration: GeofenceConfiguration { model.configuration }

    public mutating func handle(_ input: GeofenceInput, now: Date) -> [GeofenceOutput] {
        switch input {
        case .fix(let fix, let live): handle(fix, live: live, now: now.timeIntervalSince1970)
        case .motion(let sample): handle(sample)
        case .tick(let tickNow): tick(now: tickNow.timeIntervalSince1970)
        }
    }

    // MARK: Fixes

    private mutating func handle(_ fix: Fix, live: Bool, now: Double) -> [GeofenceOutput] {
        if let seq = fix.seq {
            guard seq > lastSeq else { return [] }
            lastSeq = seq
        }
        let time = fix.time.timeIntervalSince1970
        guard fix.lat.isFinite, fix.lon.isFinite, abs(fix.lat) <= 90, abs(fix.lon) <= 180, Self.isSane(time) else { return [] }
        let slot = slot(for: fix.device)
        if Self.isSane(now) { devices[slot].lastSeenAt = now }
        let previous = devices[slot].lastFix
        // A straggler behind a newer fix would make the device jump back and forth. A "newer" fix
        // dated ahead of the clock, followed by one that is not, was a clock error (ingest takes
        // fixes up to a day ahead): it must not turn every fix of the next day into a straggler,
        // and so keep the gate shut. A phone whose clock is always ahead is judged as before.
        if let previous, time < previous.time, !Self.wasClockError(previous.time, correctedBy: time, now: now) { return [] }
        let here = DeviceState.Position(time: time, lat: fix.lat, lon: fix.lon, seq: fix.seq, imported: live ? nil : true)
        devices[slot].lastFix = here
        let point = Coordinate(lat: fix.lat, lon: fix.lon)
        let reported = fix.accuracyM ?? 0
        let accuracy = reported.isNaN || reported < 0 ? 0 : reported

        var transitions: [(rank: Int, zone: Int, transition: GeofenceTransition)] = []
        func transition(_ event: GeofenceTransition.Event, zone: Int, at position: DeviceState.Position, dwellS: Double? = nil, time: Double? = nil) {
            let rank = event == .dwell ? 0 : event == .exit ? 1 : 2
            transitions.append((rank, zone, GeofenceTransition(
                device: fix.device, zone: model.zones[zone].id, event: event, time: Date(timeIntervalSince1970: time ?? position.time),
                lat: position.lat, lon: position.lon, seq: position.seq, dwellS: dwellS, imported: position.imported)))
        }

        // Zones the device is in: exit, or stay and perhaps dwell.
        var exited: [Int] = []
        for v in devices[slot].visits.indices {
            let visit = devices[slot].visits[v]
            let zone = model.zones[visit.zone]
            guard !(accuracy > zone.accuracyLimitM) else { continue }
            if zone.isBeyond(point, hysteresisM: model.hysteresisM) {
                exited.append(visit.zone)
                transition(.exit, zone: visit.zone, at: here)
                continue
            }
            let dwellAt = visit.enteredAt + model.minDwellS
            if time <= dwellAt { devices[slot].visits[v].anchor = here }
            if !visit.dwellFired && time >= dwellAt {
                devices[slot].visits[v].dwellFired = true
                transition(.dwell, zone: visit.zone, at: devices[slot].visits[v].anchor, dwellS: model.minDwellS, time: dwellAt)
            }
        }

        // Zones the device is not in: enter.
        func consider(_ zone: Int) {
            let compiled = model.zones[zone]
            guard !(accuracy > compiled.accuracyLimitM), compiled.contains(point),
                  !devices[slot].visits.contains(where: { $0.zone == zone })
            else { return }
            devices[slot].visits.append(DeviceState.Visit(zoneID: compiled.id, zone: zone, enteredAt: time, dwellFired: false, anchor: here))
            transition(.enter, zone: zone, at: here)
            if model.minDwellS == 0 {
                devices[slot].visits[devices[slot].visits.count - 1].dwellFired = true
                transition(.dwell, zone: zone, at: here, dwellS: 0)
            }
        }
        if let index = model.index {
            candidates.removeAll(keepingCapacity: true)
            index.candidates(at: point, into: &candidates)
            for zone in candidates { consider(Int(zone)) }
        } else {
            for zone in model.zones.indices { consider(zone) }
        }

        guard !transitions.isEmpty else { return [] }
        if !exited.isEmpty { devices[slot].visits.removeAll { exited.contains($0.zone) } }
        transitions.sort { ($0.rank, $0.zone) < ($1.rank, $1.zone) }
        var outputs = transitions.map { GeofenceOutput.transition($0.transition) }
        for (_, zone, transition) in transitions where transition.event != .dwell {
            for gate in model.gatesByZone[zone] {
                if let call = gateCall(gate, zone: zone, event: transition.event, fix: fix, slot: slot, live: live, now: now, previous: previous) {
                    outputs.append(.gate(call))
                }
            }
        }
        return outputs
    }

    /// The call `gate` makes for this transition, if every rule allows it; records the firing.
    private mutating func gateCall(
        _ gateIndex: Int, zone: Int, event: GeofenceTransition.Event, fix: Fix, slot: Int, live: Bool, now: Double,
        previous: DeviceState.Position?
    ) -> GateCall? {
        let compiled = model.gates[gateIndex]
        let gate = compiled.gate
        let time = fix.time.timeIntervalSince1970
        guard gate.on.rawValue == event.rawValue,
              compiled.devices?.contains(fix.device) ?? true,
              live,  // an imported fix changes state but never opens a gate
              now - time <= gate.maxAgeS  // nor does a stale one (false for NaN)
        else { return nil }
        let speed = Self.speed(fix, previous: previous)
        if let minimum = gate.minSpeedMps {
            guard let speed, speed >= minimum else { return nil }
        }
        if let activity = gate.motion {
            guard devices[slot].activity(at: time) == activity else { return nil }
        }
        let last = devices[slot].firings.firstIndex { $0.gate == gateIndex }
        if let last {
            let firing = devices[slot].firings[last]
            if let seq = fix.seq, firing.seq == seq { return nil }  // never twice for one fix
            // A firing dated ahead of the clock, by a fix with a wrong time, does not hold the gate
            // shut until the clock gets there for a correctly dated fix.
            guard time - firing.time >= gate.cooldownS || Self.wasClockError(firing.time, correctedBy: time, now: now) else { return nil }
        }
        let firing = DeviceState.Firing(gateID: gate.id, gate: gateIndex, time: time, seq: fix.seq)
        if let last { devices[slot].firings[last] = firing } else { devices[slot].firings.append(firing) }

        let values = Template.Values(
            gate: gate.id, device: fix.device, zone: model.zones[zone].id, time: RFC3339.format(fix.time),
            lat: fix.lat, lon: fix.lon, speedMps: speed)
        return GateCall(
            gate: gate.id, device: fix.device, zone: model.zones[zone].id, fixSeq: fix.seq,
            idempotencyKey: "\(gate.id):\(fix.device):\(Self.fixKey(seq: fix.seq, time: time))",
            url: compiled.url.render(values, mode: .url), method: compiled.method, headers: compiled.headers,
            body: compiled.body.render(values, mode: compiled.bodyMode), time: fix.time, values: values)
    }

    /// The reported speed, else the speed from the previous fix.
    static func speed(_ fix: Fix, previous: DeviceState.Position?) -> Double? {
        if let reported = fix.speedMps, reported.isFinite, reported >= 0 { return reported }
        guard let previous else { return nil }
        let elapsed = fix.time.timeIntervalSince1970 - previous.time
        guard elapsed > 0 else { return nil }
        return Geo.distance(Coordinate(lat: previous.lat, lon: previous.lon), Coordinate(lat: fix.lat, lon: fix.lon)) / elapsed
    }

    // MARK: Motion and the clock

    private mutating func handle(_ sample: MotionSample) -> [GeofenceOutput] {
        if let seq = sample.seq {
            guard seq > lastSeq else { return [] }
            lastSeq = seq
        }
        let start = sample.start.timeIntervalSince1970
        guard Self.isSane(start) else { return [] }
        devices[slot(for: sample.device)].record(DeviceState.Motion(start: start, activity: sample.activity))
        return []
    }

    private mutating func tick(now: Double) -> [GeofenceOutput] {
        guard Self.isSane(now) else { return [] }
        var outputs: [GeofenceOutput] = []
        for slot in devices.indices {
            guard let seen = devices[slot].lastSeenAt, now - seen >= model.minDwellS else { continue }
            for v in devices[slot].visits.indices where !devices[slot].visits[v].dwellFired {
                devices[slot].visits[v].dwellFired = true
                let visit = devices[slot].visits[v]
                outputs.append(.transition(GeofenceTransition(
                    device: devices[slot].id, zone: model.zones[visit.zone].id, event: .dwell,
                    time: Date(timeIntervalSince1970: visit.enteredAt + model.minDwellS),
                    lat: visit.anchor.lat, lon: visit.anchor.lon, seq: visit.anchor.seq, dwellS: model.minDwellS, imported: visit.anchor.imported)))
            }
        }
        return outputs
    }

    // MARK: Helpers

    private mutating func slot(for device: String) -> Int {
        if recentSlot >= 0, devices[recentSlot].id == device { return recentSlot }
        // A home has a handful of devices: comparing ids beats hashing them.
        if devices.count <= 8 {
            if let slot = devices.firstIndex(where: { $0.id == device }) {
                recentSlot = slot
                return slot
            }
        } else if let slot = deviceSlots[device] {
            recentSlot = slot
            return slot
        }
        devices.append(DeviceState(id: device))
        deviceSlots[device] = devices.count - 1
        recentSlot = devices.count - 1
        return recentSlot
    }

    /// Within about ±3000 years of 1970: beyond, time arithmetic and formatting stop making sense.
    static func isSane(_ time: Double) -> Bool { abs(time) < 1e11 }

    /// How far ahead of the service's clock a fix may be dated before its time counts as wrong:
    /// more than a phone's and a server's clocks disagree by when both keep time.
    static let clockSkewS = 300.0

    /// Whether `time` lies ahead of the clock `now` by more than `clockSkewS` (false when the
    /// clock is not known).
    static func isAhead(_ time: Double, of now: Double) -> Bool { isSane(now) && time > now + clockSkewS }

    /// Whether a time the device's state holds was a clock error that `time`, correctly dated,
    /// now corrects: it lies ahead of the clock and `time` does not. (A phone whose clock is
    /// always ahead is judged as any other.)
    static func wasClockError(_ stored: Double, correctedBy time: Double, now: Double) -> Bool {
        isAhead(stored, of: now) && !isAhead(time, of: now)
    }

    /// The fix's seq, or for a fix that has none (not from the journal) its time in milliseconds.
    static func fixKey(seq: UInt64?, time: Double) -> String {
        if let seq { return String(seq) }
        return isSane(time) ? "t\(Int64((time * 1000).rounded()))" : "t0"
    }

    // MARK: Checkpoint

    enum CodingKeys: String, CodingKey {
        case version, devices
        case lastSeq = "last_seq"
    }

    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        let configuration = try CheckpointConfiguration.read(GeofenceConfiguration.self, from: decoder)
        let version = try container.decode(Int.self, forKey: .version)
        guard version == 1 else {
            throw DecodingError.dataCorruptedError(forKey: .version, in: container, debugDescription: "checkpoint version \(version) is not 1")
        }
        self.init(configuration: configuration)
        lastSeq = try container.decode(UInt64.self, forKey: .lastSeq)
        for var device in try container.decode([DeviceState].self, forKey: .devices) where deviceSlots[device.id] == nil {
            device.resolve(in: model)
            deviceSlots[device.id] = devices.count
            devices.append(device)
        }
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(1, forKey: .version)
        try container.encode(lastSeq, forKey: .lastSeq)
        try container.encode(devices, forKey: .devices)
    }
}
