import CLibZ
import DrivebusSchema
import Foundation

/// What makes a fix (device, time, position) or a motion sample (device, start, activity) the
/// same as one already journaled: clients such as Overland re-send whole batches.
///
/// The identity is a 128-bit digest of those fields. Digests of sealed segments are stored in
/// their index files, so the digest is the same in every process (SipHash-2-4 under fixed keys,
/// not Swift's per-process seeded `Hasher`). Two different records collide with odds of about
/// n²/2¹²⁹: 10⁻²³ for a hundred million records. The device's hash and the record's time ride
/// along: the time picks which sealed segments can hold the key, and both build the index by
/// device and time.
struct DedupKey: Hashable, Sendable {
    struct Digest: Hashable, Comparable, Sendable {
        var high: UInt64
        var low: UInt64

        static func < (a: Digest, b: Digest) -> Bool { (a.high, a.low) < (b.high, b.low) }
    }

    let digest: Digest
    let deviceHash: UInt64
    /// The record's time (a fix's time, a sample's or a stay's start), in milliseconds.
    let milliseconds: Int64

    static func == (a: DedupKey, b: DedupKey) -> Bool { a.digest == b.digest }
    /// Half the digest is already a keyed hash of the record: hashing it again whole only costs.
    func hash(into hasher: inout Hasher) { hasher.combine(digest.high) }

    init(digest: Digest, deviceHash: UInt64, milliseconds: Int64) {
        self.digest = digest
        self.deviceHash = deviceHash
        self.milliseconds = milliseconds
    }

    /// The digest hashes the device's length and bytes, the time and `a` and `b`, little-endian.
    /// Those bytes are laid out on the stack: in a new array (and the device's in another, for
    /// `deviceHash`) they were two of the few allocations ingest makes for each fix.
    private init(device: String, milliseconds: Int64, a: UInt64, b: UInt64) {
        var device = device
        (digest, deviceHash) = device.withUTF8 { deviceBytes in
            let count = 8 + deviceBytes.count + 24
            let digest = withUnsafeTemporaryAllocation(byteCount: count, alignment: 8) { fields in
                fields.storeBytes(of: UInt64(deviceBytes.count).littleEndian, toByteOffset: 0, as: UInt64.self)
                UnsafeMutableRawBufferPointer(rebasing: fields[8..<(8 + deviceBytes.count)]).copyMemory(from: UnsafeRawBufferPointer(deviceBytes))
                let words = 8 + deviceBytes.count
                fields.storeBytes(of: UInt64(bitPattern: milliseconds).littleEndian, toByteOffset: words, as: UInt64.self)
                fields.storeBytes(of: a.littleEndian, toByteOffset: words + 8, as: UInt64.self)
                fields.storeBytes(of: b.littleEndian, toByteOffset: words + 16, as: UInt64.self)
                let bytes = UnsafeRawBufferPointer(fields)
                return Digest(high: SipHash24.hash(bytes, key: SipHash24.digestHigh), low: SipHash24.hash(bytes, key: SipHash24.digestLow))
            }
            return (digest, SipHash24.hash(UnsafeRawBufferPointer(deviceBytes), key: SipHash24.device))
        }
        self.milliseconds = milliseconds
    }

    /// The device's part of the index by device and time.
    static func deviceHash(_ device: String) -> UInt64 {
        var device = device
        return device.withUTF8 { SipHash24.hash(UnsafeRawBufferPointer($0), key: SipHash24.device) }
    }

    static func milliseconds(_ date: Date) -> Int64 { Int64((date.timeIntervalSince1970 * 1000).rounded()) }

    init(_ fix: Fix) {
        self.init(
            device: fix.device, milliseconds: Self.milliseconds(fix.time),
            // -0.0 is journaled as 0 (JSON has one zero), so it must key as 0 too.
            a: (fix.lat == 0 ? 0 : fix.lat).bitPattern, b: (fix.lon == 0 ? 0 : fix.lon).bitPattern)
    }

    init(_ sample: MotionSample) {
        self.init(
            device: sample.device, milliseconds: Self.milliseconds(sample.start),
            a: UInt64(MotionSample.Activity.allCases.firstIndex(of: sample.activity)!) | (1 << 63),
            b: UInt64(MotionSample.Confidence.allCases.firstIndex(of: sample.confidence)!))
    }

    /// A phone's own transition: MQTT redelivers, and apps resend, what was not acknowledged.
    init(_ transition: ClientTransition) {
        self.init(
            device: transition.device, milliseconds: Self.milliseconds(transition.time),
            a: (transition.event == "enter" ? 1 : 2) | (1 << 62), b: SipHash24.hash([UInt8](optional: transition.region), key: SipHash24.field))
    }

    /// A stay: the same history imported twice is stored once.
    init(_ visit: Visit) {
        var place = [UInt8](optional: visit.placeID)
        place.appendLittleEndian(visit.lat.bitPattern)
        place.appendLittleEndian(visit.lon.bitPattern)
        self.init(
            device: visit.device, milliseconds: Self.milliseconds(visit.start),
            a: SipHash24.hash(place, key: SipHash24.field) | (1 << 61), b: UInt64(bitPattern: Self.milliseconds(visit.end)))
    }

    /// Rebuilds the key of a journaled record.
    init?(topic: String, payload: [UInt8]) {
        if topic.hasPrefix("fix."), let fix = try? BusJSON.decode(Fix.self, from: payload) {
            self.init(fix)
        } else if topic.hasPrefix("motion."), let sample = try? BusJSON.decode(MotionSample.self, from: payload) {
            self.init(sample)
        } else if topic.hasPrefix("client.transition."), let transition = try? BusJSON.decode(ClientTransition.self, from: payload) {
            self.init(transition)
        } else if topic.hasPrefix("visit."), let visit = try? BusJSON.decode(Visit.self, from: payload) {
            self.init(visit)
        } else if RemovedRecord.isRemoved(topic: topic), let kept = RemovedRecord.key(topic: topic, payload: payload) {
            self = kept
        } else {
            return nil
        }
    }
}

/// SipHash-2-4 (Aumasson and Bernstein, 2012) of a byte string under a 128-bit key. Fixed keys:
/// what it hashes is stored on disk, so every process must get the same value.
enum SipHash24 {
    typealias Key = (UInt64, UInt64)
    static let digestHigh: Key = (0x6472_6976_6562_7573, 0x6465_6475_7031_0001)
    static let digestLow: Key = (0x6472_6976_6562_7573, 0x6465_6475_7032_0002)
    static let device: Key = (0x6472_6976_6562_7573, 0x6465_7669_6365_0003)
    static let field: Key = (0x6472_6976_6562_7573, 0x6669_656c_6400_0004)

    static func hash(_ bytes: [UInt8], key: Key) -> UInt64 {
        bytes.withUnsafeBytes { hash($0, key: key) }
    }

    static func hash(_ bytes: UnsafeRawBufferPointer, key: Key) -> UInt64 {
        var state = State(key: key)
        let whole = bytes.count / 8 * 8
        for at in stride(from: 0, to: whole, by: 8) { state.compress(UInt64(littleEndian: bytes.loadUnaligned(fromByteOffset: at, as: UInt64.self))) }
        var last = UInt64(truncatingIfNeeded: bytes.count) << 56
        for (shift, byte) in bytes[whole...].enumerated() { last |= UInt64(byte) << (8 * UInt64(shift)) }
        state.compress(last)
        return state.finalize()
    }

    /// The four words, in a struct of their own: nested functions capturing local variables
    /// would box them and check exclusive access on every round.
    private struct State {
        var v0, v1, v2, v3: UInt64

        init(key: Key) {
            v0 = key.0 ^ 0x736f_6d65_7073_6575
            v1 = key.1 ^ 0x646f_7261_6e64_6f6d
            v2 = key.0 ^ 0x6c79_6765_6e65_7261
            v3 = key.1 ^ 0x7465_6462_7974_6573
        }

        mutating func round() {
            v0 &+= v1; v1 = v1.rotatedLeft(13); v1 ^= v0; v0 = v0.rotatedLeft(32)
            v2 &+= v3; v3 = v3.rotatedLeft(16); v3 ^= v2
            v0 &+= v3; v3 = v3.rotatedLeft(21); v3 ^= v0
            v2 &+= v1; v1 = v1.rotatedLeft(17); v1 ^= v2; v2 = v2.rotatedLeft(32)
        }

        mutating func compress(_ word: UInt64) {
            v3 ^= word
            round(); round()
            v0 ^= word
        }

        mutating func finalize() -> UInt64 {
            v2 ^= 0xff
            round(); round(); round(); round()
            return v0 ^ v1 ^ v2 ^ v3
        }
    }
}

extension UInt64 {
    fileprivate func rotatedLeft(_ bits: UInt64) -> UInt64 { (self << bits) | (self >> (64 - bits)) }
}

extension [UInt8] {
    /// A string that may be missing, told apart from every present one (its length first).
    init(optional string: String?) {
        self = []
        appendLittleEndian(string.map { UInt64($0.utf8.count) } ?? .max)
        append(contentsOf: (string ?? "").utf8)
    }

    mutating func appendLittleEndian(_ value: UInt64) { Swift.withUnsafeBytes(of: value.littleEndian) { append(contentsOf: $0) } }
    mutating func appendLittleEndian(_ value: UInt32) { Swift.withUnsafeBytes(of: value.littleEndian) { append(contentsOf: $0) } }
}

/// CRC-32 (IEEE, as zip and PNG use it), to find torn records: zlib's, several times faster than
/// a byte-at-a-time table.
enum CRC32 {
    static func checksum(_ bytes: UnsafeRawBufferPointer) -> UInt32 {
        guard let base = bytes.baseAddress else { return 0 }
        return UInt32(crc32_z(0, base.assumingMemoryBound(to: Bytef.self), bytes.count))
    }

    static func checksum(_ bytes: ArraySlice<UInt8>) -> UInt32 { bytes.withUnsafeBytes { checksum($0) } }
    static func checksum(_ bytes: [UInt8]) -> UInt32 { bytes.withUnsafeBytes { checksum($0) } }
}
