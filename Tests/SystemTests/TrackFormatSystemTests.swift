import DrivebusConfiguration
import DrivebusKit
import DrivebusTestSupport
import Foundation
import Testing

/// Issue 14: a GPX whose names are not UTF-8 once killed `drivebus-stats` (no token needed) and
/// `drivebus import`. Now both name the line and live on.
@Suite(.serialized) struct TrackFormatSystemTests {
    /// Line 4 holds an element name or an attribute name with the bytes 0xFF 0xFE.
    static func invalidUTF8GPX(in place: String) -> [UInt8] {
        var bytes = Array("<?xml version=\"1.0\"?>\n<gpx version=\"1.1\" xmlns=\"http://www.topografix.com/GPX/1/1\">\n<trk><name>bad</name><trkseg>\n".utf8)
        if place == "element" {
            bytes += Array("<trkpt lat=\"48.2\" lon=\"16.3\"><e".utf8) + [0xFF, 0xFE] + Array("le>200</e".utf8) + [0xFF, 0xFE] + Array("le></trkpt>".utf8)
        } else {
            bytes += Array("<trkpt lat=\"48.2\" lon=\"16.3\" x".utf8) + [0xFF, 0xFE] + Array("=\"1\"><ele>200</ele></trkpt>".utf8)
        }
        return bytes + Array("\n<trkpt lat=\"48.21\" lon=\"16.3\"><ele>210</ele></trkpt>\n</trkseg></trk></gpx>\n".utf8)
    }

    @Test func invalidUTF8GPXIsA400AndStatsAndImportLiveOn() async throws {
        let dir = TempDir()
        let ports = freePorts(2)
        let (ingestPort, statsPort) = (ports[0], ports[1])
        let yaml = """
            state_dir: \(dir.path)/state
            heartbeat_interval_s: 0.2
            devices: [{id: car, token: car-token-0123456789}]
            ingest: {listen: "127.0.0.1:\(ingestPort)"}
            stats: {listen: "127.0.0.1:\(statsPort)"}
            """
        let path = dir.file("drivebus.yaml", yaml)
        let config = try DrivebusConfig.parse(yaml: yaml)
        let bus = try Child("drivebus-bus", ["--config", path])
        // Stats follows ingest's journal: it is live once ingest is there.
        let ingest = try Child("drivebus-ingest", ["--config", path])
        let stats = try Child("drivebus-stats", ["--config", path])
        try await waitUntilLive(.stats, config: config, child: stats)
        let rank = "http://127.0.0.1:\(statsPort)/api/v1/routes/rank"
        // Live means caught up with the journals and listening.
        #expect(try await http("GET", "http://127.0.0.1:\(statsPort)/metrics").status == 200)

        for place in ["element", "attribute"] {
            let answer = try await http("POST", rank, body: Data(Self.invalidUTF8GPX(in: place)), contentType: "application/gpx+xml")
            #expect(answer.status == 400, "\(place): \(answer.body)")
            let json = try #require(try JSONSerialization.jsonObject(with: Data(answer.body.utf8)) as? [String: Any], "\(place): \(answer.body)")
            let error = try #require(json["error"] as? [String: Any])
            #expect(error["code"] as? String == "stats.invalid_body")
            #expect(error["field"] as? String == "body")
            let message = error["message"] as? String ?? ""
            #expect(message.hasPrefix("body: line 4: not valid GPX: ") && message.contains("UTF-8"), "\(place): \(message)")
            #expect(isAlive(stats.pid), "\(place): stats died; stderr:\n\(stats.stderr)")
        }
        // And it still ranks.
        let good = """
            <gpx version="1.1"><trk><name>ok</name><trkseg><trkpt lat="48.2" lon="16.3"><ele>200</ele></trkpt><trkpt lat="48.201" lon="16.3"><ele>210</ele></trkpt></trkseg></trk></gpx>
            """
        let ranked = try await http("POST", rank, body: Data(good.utf8), contentType: "application/gpx+xml")
        #expect(ranked.status == 200 && ranked.body.contains(#""name":"ok""#), "\(ranked.body)")

        // `drivebus import` reads the file before it talks to ingest: it names the line and exits 1.
        let file = dir.path + "/bad.gpx"
        #expect(FileManager.default.createFile(atPath: file, contents: Data(Self.invalidUTF8GPX(in: "attribute"))))
        let imported = try await run("drivebus", ["import", "--config", path, "--device", "car", file])
        #expect(imported.status == 1, "\(imported.stdout)\(imported.stderr)")
        #expect(imported.stdout.hasPrefix("\(file): line 4: not valid GPX: "), "\(imported.stdout)")

        for child in [stats, ingest, bus] { child.signal(SIGTERM) }
        for child in [stats, ingest, bus] { #expect(try await child.exitStatus() == 0, "\(child.stderr)") }
    }
}
