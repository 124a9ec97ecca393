import DrivebusKit
import DrivebusTestSupport
import Foundation
import Testing

@Suite struct TimestampTests {
    @Test func formatsUTCWithMilliseconds() {
        #expect(RFC3339.format(Date(timeIntervalSince1970: 0)) == "1970-01-01T00:00:00.000Z")
        #expect(RFC3339.format(Date(timeIntervalSince1970: 1_700_000_000.123)) == "2023-11-14T22:13:20.123Z")
        #expect(RFC3339.format(Date(timeIntervalSince1970: 951_782_400)) == "2000-02-29T00:00:00.000Z")
        #expect(RFC3339.format(Date(timeIntervalSince1970: -0.001)) == "1969-12-31T23:59:59.999Z")
    }

    @Test func parsesOffsetsAndFractions() {
        #expect(RFC3339.parse("2023-11-14T22:13:20.123Z") == Date(timeIntervalSince1970: 1_700_000_000.123))
        #expect(RFC3339.parse("2023-11-15T00:13:20+02:00") == Date(timeIntervalSince1970: 1_700_000_000))
        #expect(RFC3339.parse("2023-11-14T16:43:20-0530") == Date(timeIntervalSince1970: 1_700_000_000))
        #expect(RFC3339.parse("2023-11-14T22:13:20.1236Z") == Date(timeIntervalSince1970: 1_700_000_000.124))
        #expect(RFC3339.parse("2023-11-14 22:13:20z") == Date(timeIntervalSince1970: 1_700_000_000))
    }

    @Test(arguments: [
        "2023-11-14", "2023-11-14T22:13:20", "2023-02-29T00:00:00Z", "2023-13-01T00:00:00Z",
        "2023-11-14T24:00:00Z", "2023-11-14T22:13:20.Z", "2023-11-14T22:13:20Zjunk", "", "yesterday",
    ])
    func rejectsWhatIsNotRFC3339(_ text: String) {
        #expect(RFC3339.parse(text) == nil)
    }

    @Test func formattingNeverTrapsOnDatesOutsideRFC3339() {
        #expect(RFC3339.format(Date(timeIntervalSince1970: 1e20)) == "9999-12-31T23:59:59.999Z")
        #expect(RFC3339.format(Date(timeIntervalSince1970: -1e20)) == "0000-01-01T00:00:00.000Z")
        #expect(RFC3339.format(Date(timeIntervalSince1970: .nan)) == "1970-01-01T00:00:00.000Z")
    }

    @Test func roundTripsEveryMillisecondPattern() {
        for ms in stride(from: Int64(1_600_000_000_000), to: 1_600_000_000_000 + 2000, by: 7) {
            let date = Date(timeIntervalSince1970: Double(ms) / 1000)
            #expect(RFC3339.parse(RFC3339.format(date)) == date)
        }
    }
}

@Suite struct EnvelopeTests {
    let fix = Fix(
        seq: 42, device: "car", time: Date(timeIntervalSince1970: 1_700_000_000.5), lat: 48.2082, lon: 16.3738,
        accuracyM: 4.5, speedMps: 13.9, source: .overland, meta: ["device_id": "iphone"])

    @Test func fixRoundTripsThroughFrames() throws {
        let header = EnvelopeHeader(id: "7d0c1a6e-0000-4000-8000-000000000001", type: "fix", source: "ingest", seq: 7, epoch: "e1", time: Date(timeIntervalSince1970: 1_700_000_001))
        let message = BusMessage(topic: Topic.make("fix", device: "car"), header: header, payload: try BusJSON.encode(fix))
        let decoded = try BusMessage(frames: message.frames)
        #expect(decoded.topic == "fix.car")
        #expect(decoded.header == header)
        #expect(decoded.device == "car")
        #expect(try decoded.decode(Fix.self) == fix)
    }

    @Test func wireFormatIsSnakeCaseWithRFC3339Times() throws {
        let json = String(decoding: try BusJSON.encode(fix), as: UTF8.self)
        #expect(json == #"{"accuracy_m":4.5,"device":"car","lat":48.2082,"lon":16.3738,"meta":{"device_id":"iphone"},"seq":42,"source":"overland","speed_mps":13.9,"time":"2023-11-14T22:13:20.500Z"}"#)
        let header = EnvelopeHeader(id: "abc", type: "trip.ended", source: "trips", seq: 3, epoch: "boot", time: Date(timeIntervalSince1970: 0))
        #expect(String(decoding: header.encoded(), as: UTF8.self)
            == #"{"v":1,"id":"abc","type":"trip.ended","source":"trips","seq":3,"epoch":"boot","time":"1970-01-01T00:00:00.000Z"}"#)
    }

    /// The widest header (every number at its longest, a time at each end of what RFC 3339 can
    /// spell) fits the room the writer makes for it and reads back as itself.
    @Test func theWidestHeadersAreWrittenWhole() throws {
        for time in [Date(timeIntervalSince1970: -62_167_219_200), Date(timeIntervalSince1970: 253_402_300_799.999)] {
            var header = EnvelopeHeader(
                id: String(repeating: "f", count: 36), type: "trip.ended", source: "trips", seq: .max, epoch: String(repeating: "e", count: 36),
                time: time, logSeq: .max)
            header.v = .min
            var bytes: [UInt8] = [UInt8(ascii: "[")]  // after other bytes, as in a publisher's buffer
            header.write(to: &bytes)
            let written = String(decoding: bytes.dropFirst(), as: UTF8.self)
            let year = time.timeIntervalSince1970 < 0 ? "0000-01-01T00:00:00.000Z" : "9999-12-31T23:59:59.999Z"
            #expect(written == #"{"v":-9223372036854775808,"id":"ffffffffffffffffffffffffffffffffffff","type":"trip.ended","source":"trips","seq":18446744073709551615,"epoch":"eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee","time":"\#(year)","log_seq":18446744073709551615}"#)
            #expect(try BusJSON.decode(EnvelopeHeader.self, from: Array(bytes.dropFirst())) == header)
        }
    }

    /// A value that repeats from message to message (a publisher's epoch) is given back as the
    /// known `String` itself, with no new one made; any other text, or an escaped one, is read anew.
    @Test func aKnownStringIsReusedOnlyForTheSameText() throws {
        let known = "0b1c6f1e-5f0e-4a8e-9a3b-6f1d2c3b4a59"
        func storage(_ string: String) -> UnsafeRawPointer? {
            string.utf8.withContiguousStorageIfAvailable { UnsafeRawPointer($0.baseAddress) } ?? nil
        }
        func read(_ json: String) throws -> String {
            var reader = JSONReader(Array(json.utf8))
            return try reader.readString(reusing: known)
        }
        let same = try read(#""0b1c6f1e-5f0e-4a8e-9a3b-6f1d2c3b4a59""#)
        #expect(same == known)
        #expect(storage(same) == storage(known))
        let escaped = try read(#""0b1c6f1e-5f0e-4a8e-9a3b-6f1d2c3b4a5\u0039""#)
        #expect(escaped == known)
        for other in ["0b1c6f1e-5f0e-4a8e-9a3b-6f1d2c3b4a58", "0b1c6f1e-5f0e-4a8e-9a3b-6f1d2c3b4a5", "", "0b1c6f1e-5f0e-4a8e-9a3b-6f1d2c3b4a590"] {
            let read = try read("\"\(other)\"")
            #expect(read == other)
            #expect(storage(read) != storage(known))
        }
        var reader = JSONReader(Array(#""e""#.utf8))
        #expect(try reader.readString(reusing: nil) == "e")
    }

    @Test func consumersIgnoreUnknownFields() throws {
        let payload = #"{"device":"car","time":"2023-11-14T22:13:20.500Z","lat":1,"lon":2,"source":"api","future_field":[1,2]}"#
        let header = #"{"v":1,"id":"x","type":"fix","source":"ingest","seq":1,"epoch":"e","time":"2023-11-14T22:13:20.500Z","hint":"new"}"#
        let message = try BusMessage(frames: [Array("fix.car".utf8), Array(header.utf8), Array(payload.utf8)])
        #expect(try message.decode(Fix.self).lat == 1)
    }

    @Test func malformedEnvelopesAreRefusedWithStableCodes() {
        let header = Array(#"{"v":1,"id":"x","type":"fix","source":"ingest","seq":1,"epoch":"e","time":"2023-11-14T22:13:20.500Z"}"#.utf8)
        #expect(throws: EnvelopeError.frameCount(2)) { try BusMessage(frames: [Array("fix.car".utf8), header]) }
        #expect(throws: EnvelopeError.topic("fix car")) { try BusMessage(frames: [Array("fix car".utf8), header, []]) }
        #expect(throws: EnvelopeError.unsupportedVersion(2)) {
            try BusMessage(frames: [Array("fix".utf8), Array(#"{"v":2,"id":"x","type":"fix","source":"s","seq":1,"epoch":"e","time":"2023-11-14T22:13:20Z"}"#.utf8), []])
        }
        do {
            _ = try BusMessage(frames: [Array("fix".utf8), Array("{nope".utf8), []])
            Issue.record("a broken header was accepted")
        } catch {
            #expect(error.code == "envelope.header")
        }
    }

    @Test func deviceIDsAndTypesAreChecked() {
        #expect(DeviceID.isValid("car_1-A"))
        #expect(!DeviceID.isValid(""))
        #expect(!DeviceID.isValid("car.1"))
        #expect(!DeviceID.isValid(String(repeating: "a", count: 65)))
        #expect(Topic.isValidType("svc.heartbeat"))
        #expect(!Topic.isValidType("svc..heartbeat"))
        #expect(!Topic.isValidType("Fix"))
    }

    @Test func seqTrackerReportsGapsPerSourceAndEpoch() {
        var tracker = SeqTracker()
        #expect(tracker.observe(source: "ingest", epoch: "a", seq: 1) == .first)
        #expect(tracker.observe(source: "ingest", epoch: "a", seq: 2) == .inOrder)
        #expect(tracker.observe(source: "trips", epoch: "t", seq: 10) == .first)
        #expect(tracker.observe(source: "ingest", epoch: "a", seq: 6) == .gap(missing: 3...5))
        #expect(tracker.observe(source: "ingest", epoch: "a", seq: 4) == .stale)
        #expect(tracker.observe(source: "ingest", epoch: "a", seq: 7) == .inOrder)
        #expect(tracker.observe(source: "ingest", epoch: "b", seq: 1) == .newEpoch)
        #expect(tracker.observe(source: "ingest", epoch: "b", seq: 2) == .inOrder)
        #expect(tracker.observe(source: "trips", epoch: "t", seq: 11) == .inOrder)
    }

    @Test func anRPCsOpIsReadFromTheHeadOrFromTheWholeBody() {
        #expect(RPCRequestHead.op(of: Array(#"{"op":"publish","device":"car","fixes":[]}"#.utf8)) == "publish")
        #expect(RPCRequestHead.op(of: Array(#"{"device":"car","op":"health"}"#.utf8)) == "health")
        #expect(RPCRequestHead.op(of: Array(#"{"op":"a\"b"}"#.utf8)) == "a\"b")
        #expect(RPCRequestHead.op(of: Array(#"{"op":"publish""#.utf8)) == "publish")
        #expect(RPCRequestHead.op(of: Array(#"{"op":1}"#.utf8)) == nil)
        #expect(RPCRequestHead.op(of: Array("[]".utf8)) == nil)
    }

    @Test func rpcRepliesFlattenTheResult() throws {
        let ok = RPCReply.success(RPCRequestHead(op: "x"))
        #expect(String(decoding: try BusJSON.encode(ok), as: UTF8.self) == #"{"ok":true,"op":"x"}"#)
        let failed = RPCReply<RPCEmpty>.failure(.unknownOp("nope"))
        #expect(String(decoding: try BusJSON.encode(failed), as: UTF8.self) == #"{"error":{"code":"rpc.unknown_op","message":"unknown op \"nope\""},"ok":false}"#)
        let decoded = try BusJSON.decode(RPCReply<RPCEmpty>.self, from: Array(#"{"ok":false,"error":{"code":"c","message":"m"}}"#.utf8))
        #expect(throws: RPCErrorBody(code: "c", message: "m")) { try decoded.get() }
    }
}

/// `drivebus import`'s binary batches: exact both ways, and every damage an error with its place.
@Suite struct PackedFixesTests {
    static let fixes = [
        PackedFixes.Fix(time: Date(timeIntervalSince1970: 1_700_000_000.1234), lat: 48.2000012, lon: -16.37, accuracyM: 5, courseDeg: 359.9),
        PackedFixes.Fix(time: Date(timeIntervalSince1970: 1_700_000_001), lat: -0.0, lon: 180),
        PackedFixes.Fix(time: Date(timeIntervalSince1970: 1_700_000_002), lat: 1e-7, lon: 2, accuracyM: 0, altitudeM: -12.25, speedMps: 33.3, courseDeg: 0, battery: 0.5),
    ]

    @Test func roundTripsExactly() throws {
        let body = PackedFixes.encode(device: "car", fixes: Self.fixes)
        #expect(body.starts(with: Array(#"{"op":"publish_packed","device":"car","count":3}"#.utf8) + [0x0A]))
        let decoded = try PackedFixes.decode(body)
        #expect(decoded.device == "car")
        #expect(decoded.fixes == Self.fixes)
        #expect(decoded.fixes[1].lat.sign == .minus)
        #expect(RPCRequestHead.op(of: body) == "publish_packed")
        #expect(try PackedFixes.decode(PackedFixes.encode(device: "car", fixes: [])).fixes.isEmpty)
    }

    @Test func damageIsAnErrorNamingThePlace() {
        let body = PackedFixes.encode(device: "car", fixes: Self.fixes)
        let head = body.firstIndex(of: 0x0A)! + 1
        func failure(_ bytes: [UInt8]) -> PackedFixes.Failure? {
            do { _ = try PackedFixes.decode(bytes); return nil } catch { return error }
        }
        #expect(failure(Array(body.dropLast(1)))?.field == "fixes[2]")
        #expect(failure(body + [0])?.reason == "1 bytes after the last fix")
        var flags = body
        flags[head] = 0xFF
        #expect(failure(flags) == PackedFixes.Failure(field: "fixes[0]", reason: "unknown flags 255"))
        var time = body
        withUnsafeBytes(of: Double.nan.bitPattern.littleEndian) { time.replaceSubrange((head + 1)..<(head + 9), with: $0) }
        #expect(failure(time)?.field == "fixes[0].time")
        #expect(failure(Array(#"{"op":"publish_packed","device":"car","count":1000}"#.utf8) + [0x0A] + body[head...])?.field == "count")
        #expect(failure(Array(body[head...]))?.field == "body")
        #expect(failure(Array(#"{"op":"publish","device":"car","count":0}"#.utf8) + [0x0A])?.field == "body")
    }
}
