import DrivebusKit
import Foundation
import Testing

@Suite struct FastJSONTests {
    /// The same value through Foundation's sorted-key encoder, for comparison.
    func foundationJSON(_ fix: Fix) throws -> String {
        String(decoding: try BusJSON.encoder().encode(fix), as: UTF8.self)
    }

    @Test(arguments: [
        Fix(device: "car", time: Date(timeIntervalSince1970: 0), lat: 0, lon: 0, source: .api),
        Fix(seq: 18_446_744_073_709_551_615, device: "a_b-C", time: Date(timeIntervalSince1970: 1_763_700_000.999), lat: -89.123456789, lon: 179.99999,
            accuracyM: 0.5, altitudeM: -12.25, speedMps: 1e-7, courseDeg: 359.9, battery: 1, source: .import,
            meta: ["tid": "Q\"uote\\d", "line": "a\nb\u{1}", "ünï": "çödé 🚗"]),
    ])
    func writerMatchesFoundationByteForByte(_ fix: Fix) throws {
        #expect(String(decoding: try BusJSON.encode(fix), as: UTF8.self) == (try foundationJSON(fix)))
        #expect(try BusJSON.decode(Fix.self, from: BusJSON.encode(fix)) == fix)
        // And what Foundation wrote, the fast reader reads.
        #expect(try BusJSON.decode(Fix.self, from: Array(try foundationJSON(fix).utf8)) == fix)
    }

    @Test func readerSkipsUnknownValuesAndAcceptsWhitespaceAndNulls() throws {
        let json = """
             { "extra": {"deep": [1, -2.5e3, "x\\"y", true, false, null, {"k": []}]},
              "device" : "car", "time": "2025-01-02T03:04:05.678+01:00", "lat": 1.5E1, "lon": -0.25,
              "speed_mps": null, "source": "gpslogger", "meta": {"label": "caf\\u00e9 \\ud83d\\ude97"} }
            """
        let fix = try BusJSON.decode(Fix.self, from: Array(json.utf8))
        #expect(fix.lat == 15)
        #expect(fix.lon == -0.25)
        #expect(fix.speedMps == nil)
        #expect(fix.time == RFC3339.parse("2025-01-02T02:04:05.678Z"))
        #expect(fix.meta == ["label": "café 🚗"])
    }

    @Test(arguments: [
        (#"{"device":"car","time":"2025-01-02T03:04:05Z","lat":1,"lon":2}"#, "source: is required"),
        (#"{"device":"car","time":"2025-01-02T03:04:05Z","lat":1,"source":"api"}"#, "lon: is required"),
        (#"{"device":"car","time":"yesterday","lat":1,"lon":2,"source":"api"}"#, #"time: expected an RFC 3339 time, got "yesterday""#),
        (#"{"device":"car","time":"2025-01-02T03:04:05Z","lat":+1,"lon":2,"source":"api"}"#, "lat: invalid number +1"),
        (#"{"device":"car","time":"2025-01-02T03:04:05Z","lat":.5,"lon":2,"source":"api"}"#, "lat: invalid number .5"),
        (#"{"device":"car","time":"2025-01-02T03:04:05Z","lat":01,"lon":2,"source":"api"}"#, "lat: invalid number 01"),
        (#"{"device":"car","time":"2025-01-02T03:04:05Z","lat":1e999,"lon":2,"source":"api"}"#, "lat: invalid number 1e999"),
        (#"{"device":"car","time":"2025-01-02T03:04:05Z","lat":1,"lon":2,"source":"fax"}"#, #"source: unknown source "fax""#),
        (#"{"device":"car","lat":1,"lon":2,"source":"api","time":"2025-01-02T03:04:05Z"} x"#, "unexpected data after the JSON value"),
        (#"{"device":"car","lat":1,"lon":2"#, "unterminated object"),
        (#"{"device":tru,"lat":1}"#, "device: expected \""),
    ])
    func readerNamesTheFieldInErrors(_ json: String, _ expected: String) {
        #expect(throws: JSONReader.Failure.self) { try BusJSON.decode(Fix.self, from: Array(json.utf8)) }
        do {
            _ = try BusJSON.decode(Fix.self, from: Array(json.utf8))
        } catch {
            #expect(String(describing: error) == expected)
        }
    }

    @Test func eventIDsAreVersion8UUIDsUniquePerSeq() {
        let id = EventID.make(run: 0x0123_4567_89ab_cdef, seq: 1)
        #expect(id == "01234567-89ab-8def-8000-000000000001")
        #expect(UUID(uuidString: id) != nil)
        #expect(EventID.make(run: 0x0123_4567_89ab_cdef, seq: 2) != id)
    }
}
