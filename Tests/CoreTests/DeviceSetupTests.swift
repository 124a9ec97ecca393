import DrivebusConfiguration
import DrivebusKit
import DrivebusQRCode
import DrivebusTestSupport
import IngestCore
import Foundation
import Testing

@Suite struct DeviceSetupTests {
    @Test func qrCodeHasItsVersionsSizeAndFinderPatterns() throws {
        // 5 bytes at level M fit version 1: 21 modules a side.
        let small = try QRCode("hello")
        #expect(small.size == 21)
        // A finder pattern in three corners: a dark 7×7 ring around a light ring and a dark 3×3.
        for (cx, cy) in [(0, 0), (small.size - 7, 0), (0, small.size - 7)] {
            for i in 0..<7 {
                #expect(small.isDark(cx + i, cy) && small.isDark(cx + i, cy + 6) && small.isDark(cx, cy + i) && small.isDark(cx + 6, cy + i))
            }
            #expect(!small.isDark(cx + 1, cy + 1) && !small.isDark(cx + 5, cy + 5))
            #expect((2...4).allSatisfy { x in (2...4).allSatisfy { y in small.isDark(cx + x, cy + y) } })
        }
        // Not in the fourth.
        #expect(!small.isDark(small.size - 7, small.size - 7) || !small.isDark(small.size - 1, small.size - 7))
        // A 300-byte setup link needs a larger version, 4 modules more per version.
        let link = try QRCode(String(repeating: "x", count: 300))
        #expect(link.size > 21 && (link.size - 17) % 4 == 0)
        #expect(throws: QRCode.Failure.cannotEncode(bytes: 0)) { try QRCode("") }
        #expect(throws: QRCode.Failure.self) { try QRCode(String(repeating: "x", count: 5000)) }
    }

    @Test func qrCodeDrawsTwoRowsPerLineAndAnSVGSquarePerDarkModule() throws {
        let code = try QRCode("drivebus")
        let lines = code.terminal(margin: 2).split(separator: "\n")
        #expect(lines.count == (code.size + 4 + 1) / 2)
        #expect(lines.allSatisfy { $0.count == code.size + 4 })
        // The quiet zone is light: full blocks.
        #expect(lines[0].allSatisfy { $0 == "█" })
        let svg = code.svg(moduleSize: 4, margin: 4)
        #expect(svg.hasPrefix("<svg") && svg.hasSuffix("</svg>"))
        #expect(svg.components(separatedBy: "h1v1h-1z").count - 1 == code.modules.filter { $0 }.count)
    }

    @Test func registryRoundTripsPrivatelyAndRefusesGarbageNamingTheFile() throws {
        let dir = TempDir()
        let registry = DeviceRegistry(path: dir.path + "/data/devices.json")
        #expect(try registry.load().isEmpty)
        let token = DeviceRegistry.newToken()
        let entry = DeviceRegistry.Entry(id: "phone", tokenSHA256: TokenDigest.hex(token), app: "overland", addedAt: Date(timeIntervalSince1970: 1_764_000_000))
        try registry.save([entry])
        #expect(try registry.load() == [entry])
        let mode = try FileManager.default.attributesOfItem(atPath: registry.path)[.posixPermissions] as? Int
        #expect(mode == 0o600)
        // Only the token's SHA-256 is at rest.
        let file = try String(contentsOfFile: registry.path, encoding: .utf8)
        #expect(!file.contains(token) && file.contains(TokenDigest.hex(token)))
        #expect(TokenDigest.hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
        // 32 random bytes, base64url: 43 characters, never the same twice.
        #expect(token.count == 43 && token.allSatisfy { $0.isLetter || $0.isNumber || $0 == "-" || $0 == "_" })
        #expect(DeviceRegistry.newToken() != DeviceRegistry.newToken())

        _ = dir.file("data/devices.json", #"[{"id":"no spaces allowed","token_sha256":"00","added_at":"2026-01-01T00:00:00Z"}]"#)
        #expect(throws: ConfigError.self) { try registry.load() }
        do { _ = try registry.load() } catch { #expect(error.path.hasPrefix(registry.path)) }
        _ = dir.file("data/devices.json", "{")
        do { _ = try registry.load() } catch { #expect(error.path == registry.path) }

        // A file that is there but cannot be read is an error, not an empty list (which the next
        // save would write over the real one).
        let unreadable = DeviceRegistry(path: dir.path + "/folder")
        try FileManager.default.createDirectory(atPath: unreadable.path, withIntermediateDirectories: true)
        #expect(throws: ConfigError.self) { try unreadable.load() }
        #expect(try DeviceRegistry(path: dir.path + "/missing/devices.json").load().isEmpty)
    }

    @Test func theConfigsDevicesComeFirstAndAddedOnesAreKnownByTheirTokensDigest() throws {
        let config = try DrivebusConfig.parse(yaml: "devices: [{id: car, token: car-token-0123}]")
        let added = [
            DeviceRegistry.Entry(id: "car", tokenSHA256: TokenDigest.hex("another-token-1"), app: nil, addedAt: Date()),
            DeviceRegistry.Entry(id: "phone", tokenSHA256: TokenDigest.hex("phone-token-01"), app: "owntracks", addedAt: Date()),
        ]
        let devices = config.devices(with: added)
        #expect(devices.map(\.id) == ["car", "phone"])
        #expect(devices.map(\.token) == ["car-token-0123", nil])
        #expect(devices[1].tokenSHA256.map { $0.map { String(format: "%02x", $0) }.joined() } == TokenDigest.hex("phone-token-01"))
        // Ingest knows each by its token, the added one through its hash.
        let directory = DeviceDirectory(devices, digest: TokenDigest.sha256)
        #expect(directory.device(forToken: "car-token-0123") == "car")
        #expect(directory.device(forToken: "phone-token-01") == "phone")
        #expect(directory.device(forToken: "another-token-1") == nil)
        #expect(directory.device(forToken: TokenDigest.hex("phone-token-01")) == nil)
    }
}
