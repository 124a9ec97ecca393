import DrivebusKit
@testable import DrivebusSchema
import DrivebusTestSupport
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

    /// Escapes decode as Foundation decodes them, and what Foundation refuses is refused.
    @Test(arguments: [
        #""plain""#, #""q\"uote \\ slash\/ \b\f\n\r\t""#, #""caf\u00e9 \u00E9 \ud83d\ude97 \u0000""#, #""\u20ac\uFFFF""#,
        #""\x""#, #""\u12""#, #""\u12g4""#, #""\ud83d""#, #""\ud83d\u0041""#, #""\ude97""#, #""a\""#,
    ])
    func stringEscapesDecodeAsFoundationDoes(_ json: String) throws {
        let foundation = try? JSONDecoder().decode(String.self, from: Data(json.utf8))
        var reader = JSONReader(Array(json.utf8))
        let ours = try? reader.readString()
        #expect(ours == foundation)
        var skipping = JSONReader(Array(json.utf8))
        #expect(((try? skipping.skipValue()) != nil) == (foundation != nil))
    }

    /// Skipping (how a journal page passes each payload on) makes no strings, keys or numbers but
    /// still refuses what is not JSON (RFC 8259; Foundation agrees on all of these but the
    /// trailing comma, which it lets through), and returns the bytes as they are.
    @Test(arguments: [
        #"{"a":[1,-0.5,2E+3,0,"x\"y",true,false,null,{"b":{}},[]],"k\u00e9y":"v"}"#, #" [ 1 , {"c" : "d"} ] "#, #"-0.0"#,
    ] + [
        #"{"a":01}"#, #"{"a":1.}"#, #"{"a":-}"#, #"{"a":.5}"#, #"{"a":1e}"#, #"{"a":1e999}"#, #"{"a":"\x"}"#, #"{"\ud800":1}"#,
        #"{"a" 1}"#, #"{"a":1,}"#, #"[1 2]"#, #"{"a":tru}"#, #"{a:1}"#, #"{"a":1"#, #"{"a":0x10}"#, #"{"a":1.2.3}"#,
    ].map { "!" + $0 })
    func skippingRefusesWhatIsNotJSON(_ argument: String) throws {
        let valid = !argument.hasPrefix("!")
        let json = valid ? argument : String(argument.dropFirst())
        var reader = JSONReader(Array(json.utf8))
        let raw = try? reader.readRawValue()
        #expect((raw != nil && (try? reader.finish()) != nil) == valid, "\(json)")
        if valid { #expect(raw == Array(json.trimmingCharacters(in: .whitespaces).utf8)) }
    }

    /// An error inside a skipped object names the innermost key, as it did before skipping made
    /// no keys.
    @Test func anErrorInsideASkippedValueNamesItsKey() {
        var reader = JSONReader(Array(#"{"extra":{"deep":tru}}"#.utf8))
        let error = #expect(throws: JSONReader.Failure.self) { try reader.skipValue() }
        #expect(error?.description == "deep: invalid literal")
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
        (#"{"device":"car","time":"2025-01-02T03:04:05Z","lat":0x10,"lon":2,"source":"api"}"#, "lat: invalid number 0"),
        (#"{"device":"car","time":"2025-01-02T03:04:05Z","lat":1.5.2,"lon":2,"source":"api"}"#, "lat: invalid number 1.5.2"),
        (#"{"device":"car","time":"2025-01-02T03:04:05Z","lat":1,"lon":2,"source":"fax"}"#, #"source: unknown source "fax""#),
        (#"{"device":"car","lat":1,"lon":2,"source":"api","time":"2025-01-02T03:04:05Z"} x"#, "unexpected data after the JSON value"),
        (#"{"device":"car","lat":1,"lon":2"#, "unterminated object"),
        (#"{"device":tru,"lat":1}"#, "device: expected \""),
        (#"{"device":"car"#, "device: unterminated string"),
        (#"{"device":"car\"#, "device: unterminated string"),
        (#"{"device":"car\","#, "device: unterminated string"),
        ("{\"device\":\"c\tar\",\"lat\":1}", "device: control character in string"),
        (#"{"device":"car","lat":1,"lon":2,"source":"api","time":"2025-01-02T03:04:05Z","meta":{"a\"b":"x"#, #"a"b: unterminated string"#),
    ])
    func readerNamesTheFieldInErrors(_ json: String, _ expected: String) {
        #expect(throws: JSONReader.Failure.self) { try BusJSON.decode(Fix.self, from: Array(json.utf8)) }
        do {
            _ = try BusJSON.decode(Fix.self, from: Array(json.utf8))
        } catch {
            #expect(String(describing: error) == expected)
        }
    }

    /// The exact-decimal fast path must give what `strtod` gives, bit for bit, on the shapes
    /// phones send and on the edges of the path (16–17 digit mantissas, 22 decimals, -0).
    @Test func numbersReadExactlyAsStrtodReadsThem() throws {
        var generator = SystemRandomNumberGenerator()
        var texts = ["0", "-0", "-0.0", "0.1", "0.3", "48.2082123", "-122.030581", "9007199254740991", "9007199254740993",
                     "1.7976931348623157", "0.0000000000000000000001", "1.0000000000000000000001", "123456789012345678901234",
                     "2.5e-3", "1E2", "-1.5E+10", "4.9406564584124654e-324", "0.30000000000000004"]
        for _ in 0..<20_000 {
            let digits = Int.random(in: 1...18, using: &generator)
            var text = String(UInt64.random(in: 0..<UInt64(pow(10, Double(digits))), using: &generator))
            let point = Int.random(in: 0...text.count, using: &generator)
            if point < text.count { text.insert(".", at: text.index(text.startIndex, offsetBy: point)) }
            if text.hasPrefix(".") { text = "0" + text }
            if Bool.random(using: &generator) { text = "-" + text }
            texts.append(text)
        }
        for text in texts {
            var reader = JSONReader(Array("[\(text)]".utf8))
            var read: Double?
            try reader.readArray { (reader: inout JSONReader) throws(JSONReader.Failure) in read = try reader.readDouble() }
            let expected = strtod(text, nil)
            #expect(read?.bitPattern == expected.bitPattern, "\(text): \(String(describing: read)) != \(expected)")
        }
    }

    /// From 2^50 on, a number times 10^d can be exactly a half (42978556.98799548 × 10^8 is
    /// 4297855698799548.5), and how that tie is rounded decides whether the few-decimals path or
    /// `description` writes the number: the text must be the same either way.
    @Test func tiesInTheScaledNumberAreWrittenAsDescriptionWritesThem() {
        #expect(42978556.98799548 * 1e8 == 4297855698799548.5)
        #expect(4351398.708054609 * 1e9 == 4351398708054608.5)
        var values: [Double] = [42978556.98799548, 4351398.708054609, -42978556.98799548]
        var state: UInt64 = 0x2545_F491_4F6C_DD1D
        var scale = 10.0
        for _ in 1...9 {
            for _ in 0..<2_000 {
                state = state &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
                let whole = Double((UInt64(1) << 50) + (state >> 13))  // in [2^50, 2^52)
                let value = (whole + 0.5) / scale
                if value < 1e9, value * scale == whole + 0.5 { values.append(value) }
            }
            scale *= 10
        }
        #expect(values.count > 1_000)
        for value in values {
            var writer = JSONWriter()
            writer.number(value)
            #expect(String(decoding: writer.bytes, as: UTF8.self) == value.description, "\(value.bitPattern)")
        }
    }

    /// Numbers with few decimals are written without `description`: the text must be the very
    /// one it writes (Foundation's coders write that too), on the shapes phones send, on every
    /// magnitude, and on random bit patterns.
    @Test func fewDecimalsAreWrittenAsDescriptionWritesThem() async throws {
        try await offThePool {
            var generator = SystemRandomNumberGenerator()
            var values: [Double] = [0.001, 0.0009999, 0.1, 0.3, 0.30000000000000004, 48.2082, -122.030581, 999_999_999.5, 1e9 + 0.5,
                                    123_456.789012345, 0.123456789, 0.1234567891, 5e-324, -0.0015, 1.0000000001, 2.675, 1.005,
                                    // Exactly between two decimals of as many places that both read back as it.
                                    8_388_608.0009765625, 67_108_864.001953125, 536_870_912.00390625, -8_388_608.0009765625]
            // Phone-shaped: up to 9 decimals, at least 0.001 away from 0. Each must take the new path.
            var phoneShaped: [Double] = []
            for _ in 0..<100_000 {
                let decimals = Int.random(in: 1...9, using: &generator)
                // The double nearest to a decimal of that many places, as a phone's JSON gives it.
                let digits = String(Int.random(in: 0..<Int(pow(10, Double(decimals))), using: &generator))
                let text = "\(Int.random(in: -180...180, using: &generator)).\(String(repeating: "0", count: decimals - digits.count) + digits)"
                let value = try #require(Double(text))
                if value.magnitude >= 0.001 { phoneShaped.append(value) }
                values.append(Double.random(in: 0.0001...1e10, using: &generator) * (Bool.random(using: &generator) ? 1 : -1))
                values.append(pow(10, Double.random(in: -4...10, using: &generator)))
                let bits = Double(bitPattern: UInt64.random(in: 0...UInt64.max, using: &generator))
                if bits.isFinite { values.append(bits) }
            }
            for value in values + phoneShaped {
                var writer = JSONWriter()
                writer.number(value)
                let written = String(decoding: writer.bytes, as: UTF8.self)
                let expected = value == value.rounded() && abs(value) < 1e15 ? String(Int64(value)) : value.description
                #expect(written == expected, "\(value.bitPattern)")
            }
            let slow = phoneShaped.filter { FewDecimals($0) == nil }
            #expect(slow.isEmpty, "\(slow.prefix(5))")
        }
    }

    /// A fix as `writeJSON` writes it, with any of its optional fields, is read by the reader of
    /// that layout, to the same fix; anything else is left to the general reader, which reads it
    /// the same or names the field that is wrong.
    @Test func fixesAsWrittenTakeTheLayoutsReaderAndAnythingElseTheGeneralOne() throws {
        func asWritten(_ json: [UInt8]) -> Fix? {
            var reader = JSONReader(json)
            return Fix(readingAsWritten: &reader)
        }
        for present in 0..<128 {
            func has(_ bit: Int) -> Bool { present & (1 << bit) != 0 }
            let fix = Fix(
                seq: has(0) ? 1_234_567 : nil, device: "van-\(present)", time: Date(timeIntervalSince1970: 1_763_700_000.25 + Double(present)),
                lat: -33.856_784_123, lon: 151.215_297, accuracyM: has(1) ? 4.5 : nil, altitudeM: has(2) ? -2 : nil,
                speedMps: has(3) ? 1e-7 : nil, courseDeg: has(4) ? 359.9 : nil, battery: has(5) ? 0.5 : nil, source: .allCases[present % 6],
                meta: has(6) ? ["device_id": "phone \"1\"", "ünï": "🚗"] : nil)
            let json = BusJSON.encode(fix)
            #expect(asWritten(json) == fix, "\(String(decoding: json, as: UTF8.self))")
            #expect(try BusJSON.decode(Fix.self, from: json) == fix)
            #expect(try BusJSON.decoder().decode(Fix.self, from: Data(json)) == fix)
        }
        let expected = Fix(device: "car", time: Date(timeIntervalSince1970: 1_735_700_645), lat: 1.5, lon: -2, speedMps: 3, source: .api)
        for other in [
            #"{ "device":"car","lat":1.5,"lon":-2,"source":"api","speed_mps":3,"time":"2025-01-01T03:04:05Z"}"#,
            #"{"lat":1.5,"device":"car","lon":-2,"source":"api","speed_mps":3,"time":"2025-01-01T03:04:05Z"}"#,
            #"{"battery":null,"device":"car","lat":1.5,"lon":-2,"source":"api","speed_mps":3,"time":"2025-01-01T03:04:05Z"}"#,
            #"{"device":"car","extra":[1],"lat":1.5,"lon":-2,"source":"api","speed_mps":3,"time":"2025-01-01T03:04:05Z"}"#,
            #"{"device":"van","device":"car","lat":1.5,"lon":-2,"source":"api","speed_mps":3,"time":"2025-01-01T03:04:05Z"}"#,
            #"{"device":"car","lat":1.5,"lon":-2,"source":"api","speed_mps":3,"time":"2025-01-01T03:04:05Z" }"#,
        ] {
            #expect(asWritten(Array(other.utf8)) == nil, "\(other)")
            #expect(try BusJSON.decode(Fix.self, from: Array(other.utf8)) == expected, "\(other)")
        }
        // Cut anywhere, a fix is refused by both readers, never read past its end.
        let whole = BusJSON.encode(Fix(seq: 9, device: "car", time: Date(timeIntervalSince1970: 1_735_700_645), lat: 1.5, lon: -2, accuracyM: 3,
                                       source: .overland, meta: ["device_id": "x"]))
        for end in 0..<whole.count {
            let cut = Array(whole[..<end])
            #expect(asWritten(cut) == nil)
            #expect(throws: JSONReader.Failure.self) { try BusJSON.decode(Fix.self, from: cut) }
        }
        for (bad, field) in [
            (#"{"device":"car","lat":"x","lon":-2,"source":"api","time":"2025-01-01T03:04:05Z"}"#, "lat"),
            (#"{"device":"car","lat":1,"lon":-2,"source":"bus","time":"2025-01-01T03:04:05Z"}"#, "source"),
            (#"{"device":"car","lat":1,"lon":-2,"source":"api","time":"yesterday"}"#, "time"),
            (#"{"device":"car","lat":1,"lon":-2,"source":"api"}"#, "time"),
        ] {
            let error = #expect(throws: JSONReader.Failure.self) { try BusJSON.decode(Fix.self, from: Array(bad.utf8)) }
            #expect(error?.field == field, "\(bad): \(String(describing: error))")
        }
    }

    /// A fix's source is matched by its bytes, escaped or not, and every source has its name.
    @Test func everySourceIsReadByItsName() throws {
        for source in FixSource.allCases {
            let json = #"{"device":"car","time":"2025-01-02T03:04:05Z","lat":1,"lon":2,"source":"\#(source.rawValue)"}"#
            #expect(try BusJSON.decode(Fix.self, from: Array(json.utf8)).source == source)
        }
        let escaped = #"{"device":"car","time":"2025-01-02T03:04:05Z","lat":1,"lon":2,"source":"overl\u0061nd"}"#
        #expect(try BusJSON.decode(Fix.self, from: Array(escaped.utf8)).source == .overland)
    }

    @Test func keysMatchWhateverTheirLengthOrSpelling() throws {
        let json = #"{"lat":1,"lon":2,"source":"api","d\u0065vice":"car","a_key_longer_than_sixteen":{"tim":1},"time":"2025-01-02T03:04:05Z"}"#
        let fix = try BusJSON.decode(Fix.self, from: Array(json.utf8))
        #expect(fix.device == "car")
        var reader = JSONReader(Array(json.utf8))
        var keys: [String] = []
        var long = false
        try reader.readObject { (reader: inout JSONReader, key: JSONKey) throws(JSONReader.Failure) in
            keys.append(key.description)
            switch key {
            case "a_key_longer_than_sixteen": long = true
            case "a_key_longer_than_sixteeN", "a_key_longer_than_sixtee", "lo", "lonn": Issue.record("\(key) matched a different literal")
            default: break
            }
            try reader.skipValue()
        }
        #expect(keys == ["lat", "lon", "source", "device", "a_key_longer_than_sixteen", "time"])
        #expect(long)
    }

    @Test(arguments: [
        ("18446744073709551615", UInt64?.some(.max)), ("18446744073709551616", nil), ("99999999999999999999", nil),
        ("0", 0), ("1.0", nil), ("-1", nil), ("1e3", nil),
    ])
    func unsignedIntegersAreExactAndOverflowIsAnError(_ text: String, _ expected: UInt64?) {
        var reader = JSONReader(Array(text.utf8))
        #expect((try? reader.readUInt64()) == expected)
    }

    @Test(arguments: [
        ("9223372036854775807", Int?.some(.max)), ("-9223372036854775808", .min), ("9223372036854775808", nil),
        ("-9223372036854775809", nil), ("-0", 0), ("-7", -7),
    ])
    func signedIntegersReachBothEnds(_ text: String, _ expected: Int?) {
        var reader = JSONReader(Array(text.utf8))
        #expect((try? reader.readInt()) == expected)
    }

    @Test func integersAreWrittenExactly() {
        var writer = JSONWriter()
        writer.beginArray()
        for value in [0, -1, 7, -250, 1e15 - 1, -(1e15 - 1)] as [Double] { writer.number(value) }
        for value in [0, 9, 10, UInt64.max] as [UInt64] { writer.number(value) }
        writer.endArray()
        #expect(String(decoding: writer.bytes, as: UTF8.self)
            == "[0,-1,7,-250,999999999999999,-999999999999999,0,9,10,18446744073709551615]")
        var bytes: [UInt8] = []
        bytes.appendDecimal(Int64.min)
        #expect(String(decoding: bytes, as: UTF8.self) == "-9223372036854775808")
        // Every length of number, at both ends of it: the digits are counted before they are written.
        var power: UInt64 = 1
        for digits in 1...20 {
            let lowest: UInt64 = digits == 1 ? 0 : power
            let highest = digits == 20 ? UInt64.max : power * 10 - 1
            for value in [lowest, lowest + 1, highest - 1, highest] {
                bytes = [UInt8(ascii: "x")]
                bytes.appendDecimal(value)
                #expect(String(decoding: bytes, as: UTF8.self) == "x" + String(value))
            }
            if digits < 20 { power = digits == 1 ? 10 : power * 10 }
        }
    }

    @Test func eventIDsAreVersion8UUIDsUniquePerSeq() {
        let id = EventID.make(run: 0x0123_4567_89ab_cdef, seq: 1)
        #expect(id == "01234567-89ab-8def-8000-000000000001")
        #expect(UUID(uuidString: id) != nil)
        #expect(EventID.make(run: 0x0123_4567_89ab_cdef, seq: 2) != id)
        #expect(EventID.make(run: 0xfedc_ba98_7654_3210, seq: .max) == "fedcba98-7654-8210-bfff-ffffffffffff")
        #expect(EventID.make(run: 0, seq: 0) == "00000000-0000-8000-8000-000000000000")
        // Every digit in every place, against Foundation's spelling of the same UUID.
        for index in 0..<2_000 as Range<UInt64> {
            let run = index &* 0x9E37_79B9_7F4A_7C15, seq = ~run &* 0xBF58_476D_1CE4_E5B9
            let id = EventID.make(run: run, seq: seq)
            let high = (run & ~0xF000) | 0x8000, low = (seq & 0x3FFF_FFFF_FFFF_FFFF) | 0x8000_0000_0000_0000
            let bytes = (0..<8).map { UInt8(truncatingIfNeeded: high >> (56 - 8 * $0)) } + (0..<8).map { UInt8(truncatingIfNeeded: low >> (56 - 8 * $0)) }
            let uuid = bytes.withUnsafeBytes { UUID(uuid: $0.loadUnaligned(as: uuid_t.self)) }
            #expect(id == uuid.uuidString.lowercased())
        }
    }
}
