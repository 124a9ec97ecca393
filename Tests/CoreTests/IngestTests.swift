import DrivebusConfiguration
import DrivebusJournal
import DrivebusKit
import DrivebusTestSupport
import Foundation
import IngestCore
import Synchronization
import Testing

/// The fixtures directory, found from this file so tests run from any working directory.


/// What the journal handed to the bus, in order.
final class Published: Sendable {
    private let entries = Mutex<[(Journal.Entry, JournalRecord)]>([])
    var all: [Journal.Entry] { entries.withLock { $0.map(\.0) } }
    var fixes: [Fix] { all.filter { $0.topic.hasPrefix("fix.") }.map { try! BusJSON.decode(Fix.self, from: $0.payload) } }
    var count: Int { entries.withLock { $0.count } }
    func add(_ committed: [(entry: Journal.Entry, record: JournalRecord)]) { entries.withLock { $0 += committed.map { ($0.entry, $0.record) } } }
}

/// A handler over a real journal in a temporary directory.
struct IngestHarness {
    let dir = TempDir()
    let journal: Journal
    let handler: IngestHandler
    let published = Published()
    static let token = "car-token-0123456789"
    static let osmandIDs = ["48241179", "658765", "8737767034", "123456", "902064", "353861053849681", "861001000719969", "123456789012345"]

    init(now: Date = Date(), arrivalOrder: ArrivalOrder? = nil) throws {
        var config = DrivebusConfig.defaults(workingDirectory: "/")
        config.devices = [
            .init(id: "car", token: Self.token, allowIDAuth: false, home: nil),
            .init(id: "bike", token: "bike-token-0123456789", allowIDAuth: false, home: nil),
        ] + Self.osmandIDs.map { .init(id: $0, token: nil, allowIDAuth: true, home: nil) }
        let published = published
        journal = try Journal(path: dir.path + "/journal") { published.add($0) }
        handler = IngestHandler(config: config, journal: journal, arrivalOrder: arrivalOrder, now: { now })
    }

    func send(_ method: String, _ path: String, query: String = "", headers: [String: String] = ["Authorization": "Bearer \(Self.token)"], body: String = "") async -> IngestResponse {
        await handler.handle(IngestRequest(method: method, path: path, query: query, headers: headers, body: Array(body.utf8)))
    }
}


@Suite struct JournalTests {
    func fix(_ index: Int, device: String = "car") -> JournalRecord {
        JournalRecord(.fix(Fix(device: device, time: Date(timeIntervalSince1970: 1_700_000_000 + Double(index)), lat: 48 + Double(index) * 1e-5, lon: 16, source: .api)))
    }

    @Test func appendsInOrderSurvivesReopenAndDeduplicates() async throws {
        let dir = TempDir()
        let path = dir.path + "/journal"
        let published = Published()
        var journal: Journal? = try Journal(path: path) { published.add($0) }
        let first = try await journal!.append((0..<3).map { fix($0) })
        #expect(first == [.journaled(seq: 1), .journaled(seq: 2), .journaled(seq: 3)])
        // A re-sent batch, with one new fix and a duplicate inside the batch itself.
        let second = try await journal!.append([fix(1), fix(3), fix(3), fix(1, device: "bike")])
        #expect(second == [.duplicate, .journaled(seq: 4), .duplicate, .journaled(seq: 5)])
        #expect(published.all.map(\.seq) == [1, 2, 3, 4, 5])
        #expect(published.all.map(\.topic) == ["fix.car", "fix.car", "fix.car", "fix.car", "fix.bike"])
        #expect(published.fixes.map(\.seq) == [1, 2, 3, 4, 5])
        journal!.shutdown()
        journal = nil

        let reopened = try Journal(path: path) { published.add($0) }
        #expect(reopened.lastSeq == 5)
        #expect(try reopened.replay(fromSeq: 1, limit: 100) == published.all)
        #expect(try reopened.replay(fromSeq: 4, limit: 1).map(\.seq) == [4])
        #expect(try reopened.replay(fromSeq: 6, limit: 10).isEmpty)
        // Dedup survives the restart.
        #expect(try await reopened.append([fix(2), fix(9)]) == [.duplicate, .journaled(seq: 6)])
        reopened.shutdown()
    }

    /// The writer numbers fixes and motion samples by splicing the seq into a payload encoded
    /// before: the bytes must be those of encoding the numbered record.
    @Test func numberedPayloadsAreTheRecordsEncodedWithTheirSeq() async throws {
        let dir = TempDir()
        let published = Published()
        let journal = try Journal(path: dir.path + "/journal") { published.add($0) }
        var fix = Fix(device: "car", time: Date(timeIntervalSince1970: 1_700_000_000.25), lat: 48.5, lon: -16.25, source: .api)
        fix.accuracyM = 5
        fix.speedMps = 12.5
        fix.meta = ["note": #"say "seq":18446744073709551615"#]
        let sample = MotionSample(device: "car", start: Date(timeIntervalSince1970: 1_700_000_001), activity: .walking, confidence: .high, source: .api)
        let filler = (0..<9).map { self.fix($0) }
        #expect(try await journal.append(filler + [JournalRecord(.fix(fix)), JournalRecord(.motion(sample))]).last == .journaled(seq: 11))
        fix.seq = 10
        var numbered = sample
        numbered.seq = 11
        #expect(published.all[9].payload == BusJSON.encode(fix))
        #expect(published.all[10].payload == (try BusJSON.encode(numbered)))
        #expect(try BusJSON.decode(Fix.self, from: published.all[9].payload) == fix)
        journal.shutdown()
    }

    /// JSON has one zero: a fix at -0.0 is journaled as 0, and its re-send after a restart is
    /// still a duplicate.
    @Test func negativeZeroDeduplicatesAcrossARestart() async throws {
        let dir = TempDir()
        let path = dir.path + "/journal"
        let atZero = JournalRecord(.fix(Fix(device: "car", time: Date(timeIntervalSince1970: 1_700_000_000), lat: -0.0, lon: -0.0, source: .api)))
        let journal = try Journal(path: path) { _ in }
        #expect(try await journal.append([atZero]) == [.journaled(seq: 1)])
        journal.shutdown()
        let reopened = try Journal(path: path) { _ in }
        #expect(try await reopened.append([atZero]) == [.duplicate])
        reopened.shutdown()
    }

    @Test func aTornTailIsCutOffAndTheRestKept() async throws {
        let dir = TempDir()
        let path = dir.path + "/journal"
        let segment = path + "/00000000000000000001.seg"
        let journal = try Journal(path: path) { _ in }
        _ = try await journal.append([fix(0), fix(1)])
        journal.shutdown()
        let intact = try FileManager.default.attributesOfItem(atPath: segment)[.size] as! Int
        // A crash in the middle of writing a third record.
        let handle = try FileHandle(forWritingTo: URL(fileURLWithPath: segment))
        try handle.seekToEnd()
        try handle.write(contentsOf: Data([0x40, 0, 0, 0, 0xde, 0xad, 0xbe, 0xef]) + Data("fix.car\n{\"dev".utf8))
        try handle.close()

        let reopened = try Journal(path: path) { _ in }
        #expect(reopened.lastSeq == 2)
        #expect(try FileManager.default.attributesOfItem(atPath: segment)[.size] as! Int == intact)
        #expect(try await reopened.append([fix(2)]) == [.journaled(seq: 3)])
        #expect(try reopened.replay(fromSeq: 1, limit: 10).map(\.seq) == [1, 2, 3])
        reopened.shutdown()
    }

    @Test func damageBeforeGoodRecordsRefusesToStartInsteadOfCuttingThem() async throws {
        let dir = TempDir()
        let path = dir.path + "/journal"
        let segment = path + "/00000000000000000001.seg"
        let journal = try Journal(path: path) { _ in }
        _ = try await journal.append([fix(0), fix(1), fix(2)])
        journal.shutdown()
        // Flip a byte inside the first record's body.
        let handle = try FileHandle(forUpdating: URL(fileURLWithPath: segment))
        try handle.seek(toOffset: 12)
        try handle.write(contentsOf: Data([0x58]))
        try handle.close()
        #expect(throws: Journal.Failure.self) { try Journal(path: path) { _ in } }
    }

    /// Start-up reads the journal in pieces; records that straddle two pieces come out whole, and
    /// damage is still told from a torn tail.
    @Test(arguments: [1, 37, 4096])
    func theJournalIsReadInPiecesAtStart(_ chunkBytes: Int) async throws {
        let dir = TempDir()
        let path = dir.path + "/journal"
        let segment = path + "/00000000000000000001.seg"
        let journal = try Journal(path: path) { _ in }
        _ = try await journal.append((0..<50).map { fix($0) })
        let written = try journal.replay(fromSeq: 1, limit: 100)
        journal.shutdown()
        var options = Journal.Options()
        options.scanChunkBytes = chunkBytes
        let reopened = try Journal(path: path, options: options) { _ in }
        #expect(reopened.lastSeq == 50)
        #expect(try reopened.replay(fromSeq: 1, limit: 100) == written)
        #expect(try await reopened.append([fix(7), fix(50)]) == [.duplicate, .journaled(seq: 51)])
        reopened.shutdown()

        // A torn tail is cut, however the pieces fall.
        let intact = try FileManager.default.attributesOfItem(atPath: segment)[.size] as! Int
        let handle = try FileHandle(forWritingTo: URL(fileURLWithPath: segment))
        try handle.seekToEnd()
        try handle.write(contentsOf: Data([0x40, 0, 0, 0, 0xde, 0xad, 0xbe, 0xef]) + Data("fix.car\n{\"dev".utf8))
        try handle.close()
        let cut = try Journal(path: path, options: options) { _ in }
        #expect(cut.lastSeq == 51)
        cut.shutdown()
        #expect(try FileManager.default.attributesOfItem(atPath: segment)[.size] as! Int == intact)

        // A checksum failure early on, with good records after it, refuses to start.
        let damaged = try FileHandle(forUpdating: URL(fileURLWithPath: segment))
        try damaged.seek(toOffset: 12)
        try damaged.write(contentsOf: Data([0x58]))
        try damaged.close()
        #expect(throws: Journal.Failure.self) { try Journal(path: path, options: options) { _ in } }
    }

    /// A damaged length field reads like a record cut off at the end of the file; the records
    /// after it show it is damage, and start-up refuses rather than cutting them away.
    @Test func aDamagedLengthBeforeGoodRecordsRefusesToStart() async throws {
        let dir = TempDir()
        let path = dir.path + "/journal"
        let segment = path + "/00000000000000000001.seg"
        let journal = try Journal(path: path) { _ in }
        _ = try await journal.append([fix(0), fix(1), fix(2)])
        journal.shutdown()
        let handle = try FileHandle(forUpdating: URL(fileURLWithPath: segment))
        try handle.seek(toOffset: 2)
        try handle.write(contentsOf: Data([0x7F]))  // the first record's length, now ~8 MB
        try handle.close()
        #expect(throws: Journal.Failure.self) { try Journal(path: path) { _ in } }
    }

    @Test func concurrentBatchesShareCommitsAndKeepSeqGapless() async throws {
        let dir = TempDir()
        let published = Published()
        let journal = try Journal(path: dir.path + "/journal") { published.add($0) }
        try await withThrowingTaskGroup(of: [Journal.Outcome].self) { group in
            for batch in 0..<40 {
                group.addTask { try await journal.append((0..<50).map { self.fix(batch * 50 + $0) }) }
            }
            for try await outcomes in group { #expect(outcomes.count == 50) }
        }
        #expect(journal.lastSeq == 2000)
        #expect(published.all.map(\.seq) == Array(1...2000))
        journal.shutdown()
    }
}

@Suite struct IngestClientTests {
    /// Overland and Traccar repeat the activity with every location; only changes are kept, and
    /// what counts as a change is what the journal holds last, whatever order two requests of
    /// one phone finish in.
    @Test func motionChangesFollowTheJournalsOrder() {
        func sample(_ activity: MotionSample.Activity) -> JournalRecord {
            JournalRecord(.motion(MotionSample(device: "car", start: Date(timeIntervalSince1970: 1_700_000_000), activity: activity, confidence: .high, source: .overland)))
        }
        let changes = MotionChanges()
        let walking = changes.filter([sample(.walking)]), driving = changes.filter([sample(.automotive)])
        #expect(walking.count == 1 && driving.count == 1)
        // Journaled walking (seq 5), then driving (6); the requests finish the other way round.
        changes.commit(driving, [.journaled(seq: 6)])
        changes.commit(walking, [.journaled(seq: 5)])
        #expect(changes.filter([sample(.automotive)]).isEmpty)
        #expect(changes.filter([sample(.walking)]).count == 1)
        // An old batch sent again is a duplicate: it changes nothing.
        changes.commit([sample(.walking)], [.duplicate])
        #expect(changes.filter([sample(.automotive)]).isEmpty)
    }

    /// A stop that is refused (its time is before 2000) must not forget the open session: the
    /// next stop still names it.
    @Test func aRefusedSessionStopLeavesTheSessionOpen() async throws {
        let harness = try IngestHarness()
        let started = await harness.send("POST", "/api/v1/sessions/start", body: #"{"candidate":"Jane"}"#)
        #expect(started.status == 200)
        let refused = await harness.send("POST", "/api/v1/sessions/stop", body: #"{"time":"1999-01-01T00:00:00Z"}"#)
        #expect(refused.status == 400)
        #expect(harness.published.count == 1)
        #expect(await harness.send("POST", "/api/v1/sessions/stop", body: "").status == 200)
        let entries = harness.published.all
        #expect(entries.map(\.topic) == ["session.started.car", "session.stopped.car"])
        let stopped = try BusJSON.decode(SessionStopped.self, from: entries[1].payload)
        #expect(stopped.sessionID == JournalRecord.sessionID(device: "car", seq: 1))
        // Once stopped, it is forgotten: another stop names no session.
        #expect(await harness.send("POST", "/api/v1/sessions/stop", body: "").status == 200)
        #expect(try BusJSON.decode(SessionStopped.self, from: harness.published.all[2].payload).sessionID == "")
        harness.journal.shutdown()
    }

    @Test func osmandFixturesAreDecodedAsTraccarDoes() async throws {
        let now = Date(timeIntervalSince1970: 1_763_700_000)
        let rows = String(decoding: try fixture("osmand.tsv"), as: UTF8.self).split(separator: "\n").map { $0.split(separator: "\t", omittingEmptySubsequences: false).map(String.init) }
        #expect(rows.count == 15)
        var fixesByCase: [Int: Fix] = [:]
        var motionTopics: [String] = []
        for row in rows {
            let number = Int(row[0])!, expectation = row[1], method = row[2], uri = row[3], contentType = row[4], body = row[5]
            // Each request on its own journal: several of them describe the very same fix.
            let harness = try IngestHarness(now: now)
            defer { harness.journal.shutdown() }
            let before = harness.published.count
            let (path, query) = uri.firstIndex(of: "?").map { (String(uri[..<$0]), String(uri[uri.index(after: $0)...])) } ?? (uri, "")
            var headers: [String: String] = [:]
            if contentType != "-" { headers["Content-Type"] = contentType }
            let response = await harness.send(method, path, query: query, headers: headers, body: body == "-" ? "" : body)
            switch expectation {
            case "verifyNull":
                #expect(response.status == 401, "case \(number)")
                #expect(String(decoding: response.body, as: UTF8.self).contains(#""field":"id""#), "case \(number)")
                #expect(harness.published.count == before, "case \(number) stored something")
            case "verifyNotNull":
                // Cell and wifi only: no coordinates, acknowledged, nothing stored.
                #expect(response.status == 200, "case \(number)")
                #expect(harness.published.count == before, "case \(number)")
            default:
                #expect(response.status == 200, "case \(number): \(String(decoding: response.body, as: UTF8.self))")
                #expect(harness.published.fixes.count == 1, "case \(number)")
                fixesByCase[number] = harness.published.fixes.first
                motionTopics += harness.published.all.map(\.topic).filter { $0.hasPrefix("motion.") }
            }
        }
        // Values, against what Traccar's decoder yields.
        let json4 = try #require(fixesByCase[4])
        #expect(json4.device == "8737767034")
        #expect(json4.time == date("2021-07-21T08:06:34.444Z"))
        #expect(json4.lat == -6.1148096 && json4.lon == 106.6837015)
        #expect(json4.speedMps == 18.67)  // m/s in the JSON body
        #expect(json4.courseDeg == 63 && json4.altitudeM == 35.7 && json4.accuracyM == 3.8 && json4.battery == 0.79)
        let json3 = try #require(fixesByCase[3])
        #expect(json3.speedMps == nil && json3.courseDeg == nil && json3.battery == nil)  // -1 means unknown
        #expect(json3.lat == 37.785834000000001)
        #expect(fixesByCase[1]?.time == date("2025-06-15T13:45:12.862Z"))
        #expect(fixesByCase[1]?.device == "48241179")
        #expect(fixesByCase[7]?.time == date("2016-01-27T18:55:47Z"))
        #expect(fixesByCase[7]?.altitudeM == 224 && fixesByCase[7]?.speedMps == 0)
        #expect(fixesByCase[8]?.time == Date(timeIntervalSince1970: 1_442_068_686.579))  // epoch ms
        #expect(fixesByCase[9]?.time == date("2014-06-04T09:10:11Z"))  // yyyy-MM-dd HH:mm:ss, UTC
        #expect(fixesByCase[9]?.device == "353861053849681")
        #expect(fixesByCase[10]?.time == Date(timeIntervalSince1970: 1_377_177_267))
        #expect(fixesByCase[12]?.device == "123456")  // deviceid
        #expect(fixesByCase[12]?.time == now)  // no timestamp: the time it arrived
        #expect(fixesByCase[13]?.battery == 0.87)
        #expect(fixesByCase[14]?.lat == 60 && fixesByCase[14]?.lon == 30)  // location=lat,lon
        let knots = try #require(fixesByCase[15]?.speedMps)
        #expect(abs(knots - 40 * 0.514444) < 1e-9)
        #expect(fixesByCase[15]?.courseDeg == 7.19889788244)
        #expect(fixesByCase[15]?.source == .osmand)
        // Traccar Client's activity becomes a motion sample (only when it changes).
        #expect(motionTopics == ["motion.48241179", "motion.48241179", "motion.658765", "motion.8737767034"])
    }

    @Test func ownTracksPayloads() async throws {
        let harness = try IngestHarness()
        let samples = try JSONSerialization.jsonObject(with: try fixture("owntracks.json")) as! [String: Any]
        for sample in samples["samples"] as! [[String: Any]] {
            let body = try JSONSerialization.data(withJSONObject: sample["payload"]!)
            let auth = "Basic " + Data("jane:\(IngestHarness.token)".utf8).base64EncodedString()
            let response = await harness.send("POST", "/owntracks", headers: ["Authorization": auth, "X-Limit-D": "nokia"], body: String(decoding: body, as: UTF8.self))
            #expect(response.status == 200)
            #expect(response.body == Array("[]".utf8))
        }
        let topics = harness.published.all.map(\.topic)
        #expect(topics == ["fix.car", "fix.car", "fix.car", "client.transition.car", "fix.car", "fix.car", "client.transition.car"])
        let fixes = harness.published.fixes
        #expect(fixes[0] == Fix(
            seq: 1, device: "car", time: Date(timeIntervalSince1970: 1_706_856_298), lat: 48.856826, lon: 2.292713, altitudeM: 154,
            speedMps: 0, battery: 0.53, source: .owntracks, meta: ["tid": "j1", "x_limit_d": "nokia"]))
        #expect(abs(fixes[1].speedMps! - 61 / 3.6) < 1e-12)  // km/h
        #expect(fixes[1].courseDeg == 271 && fixes[1].accuracyM == 5 && fixes[1].meta?["topic"] == "owntracks/jane/iphone")
        #expect(fixes[3].accuracyM == 1600 && fixes[3].battery == 0.99)
        let transition = try BusJSON.decode(ClientTransition.self, from: harness.published.all[3].payload)
        #expect(transition.event == "enter" && transition.region == "My favorite coffee shop (Delaville)")
        #expect(transition.time == Date(timeIntervalSince1970: 1_707_057_574))

        // Zero-length POSTs are legal and store nothing; the token, not the label, decides.
        #expect(await harness.send("POST", "/pub", body: "").status == 200)
        #expect(harness.published.count == 7)
        harness.journal.shutdown()
    }

    @Test func overlandBatchesAndResends() async throws {
        let harness = try IngestHarness()
        let root = try JSONSerialization.jsonObject(with: try fixture("overland.json")) as! [String: Any]
        let bodies = try (root["samples"] as! [[String: Any]]).map { String(decoding: try JSONSerialization.data(withJSONObject: $0["payload"]!), as: UTF8.self) }
        for body in bodies {
            let response = await harness.send("POST", "/overland", body: body)
            #expect(response.status == 200)
            #expect(String(decoding: response.body, as: UTF8.self) == #"{"result":"ok"}"#)
        }
        let fixes = harness.published.fixes
        // Both bodies hold the same location: the second is a re-send. The action record is no fix.
        #expect(fixes.count == 1)
        #expect(fixes[0] == Fix(
            seq: 1, device: "car", time: date("2015-10-01T15:00:00Z"), lat: 37.3318, lon: -122.030581, accuracyM: 30,
            altitudeM: 0, speedMps: 4, battery: 0.8, source: .overland))
        let motion = harness.published.all.filter { $0.topic == "motion.car" }.map { try! BusJSON.decode(MotionSample.self, from: $0.payload) }
        #expect(motion.map(\.activity) == [.automotive])
        // Re-sending the first batch changes nothing.
        let count = harness.published.count
        #expect(await harness.send("POST", "/overland", body: bodies[0]).status == 200)
        #expect(harness.published.count == count)
        harness.journal.shutdown()
    }

    /// Each location of a batch carries the activities of its moment: a run of one activity is one
    /// change, started at the run's first location, and a later batch that goes on with it adds none.
    @Test func aRunOfOneActivityInABatchIsOneChange() async throws {
        let harness = try IngestHarness()
        func batch(_ activities: [String], from first: Int) -> String {
            let locations = activities.enumerated().map { index, activity in
                #"{"geometry":{"coordinates":[16.37,48.2\#(first + index)]},"properties":{"timestamp":"2025-01-01T00:00:0\#(first + index)Z","motion":["\#(activity)"]}}"#
            }
            return #"{"locations":[\#(locations.joined(separator: ","))]}"#
        }
        #expect(await harness.send("POST", "/overland", body: batch(["driving", "driving", "walking", "walking", "driving"], from: 0)).status == 200)
        #expect(await harness.send("POST", "/overland", body: batch(["driving", "stationary"], from: 5)).status == 200)
        let motion = harness.published.all.filter { $0.topic == "motion.car" }.map { try! BusJSON.decode(MotionSample.self, from: $0.payload) }
        #expect(motion.map(\.activity) == [.automotive, .walking, .automotive, .stationary])
        #expect(motion.map(\.start) == [0, 2, 4, 6].map { date("2025-01-01T00:00:0\($0)Z") })
        #expect(harness.published.fixes.count == 7)
        harness.journal.shutdown()
    }

    @Test func overlandKeepsWhatBecomesAFixAndReadsTheRestPastIt() async throws {
        let harness = try IngestHarness()
        // Fields nobody reads (nested as deep as allowed, escaped, repeated), numbers as strings, a key spelled with
        // an escape, an app event without a geometry, and a key given twice: the last one counts.
        let body = #"""
            {"locations":[
              {"type":"Feature","geometry":null,"properties":{"action":"app_terminated"}},
              {"type":"Feature","geometry":{"type":"Point","coordinates":["16.3725","48.2082",12]},
               "properties":{"\u0074imestamp":"2025-01-01T00:00:05Z","wifi":"home \"net\"","deferred":[{"a":[1,{"b":null}]}],
                 "deep":\#(String(repeating: "[", count: 60) + String(repeating: "]", count: 60)),
                 "speed":99,"speed":"4.5","horizontal_accuracy":null,"altitude":"","battery_level":0.5,"course":90,
                 "motion":["stationary","driving",7]}}
            ],"trip_id":{"nested":[true,false]}}
            """#
        let response = await harness.send("POST", "/overland", body: body)
        #expect(response.status == 200, "\(String(decoding: response.body, as: UTF8.self))")
        #expect(harness.published.fixes == [Fix(
            seq: 1, device: "car", time: date("2025-01-01T00:00:05Z"), lat: 48.2082, lon: 16.3725, speedMps: 4.5, courseDeg: 90,
            battery: 0.5, source: .overland)])
        let motion = harness.published.all.filter { $0.topic == "motion.car" }.map { try! BusJSON.decode(MotionSample.self, from: $0.payload) }
        #expect(motion.map(\.activity) == [.automotive])
        harness.journal.shutdown()
    }

    @Test func gpsLoggerForms() async throws {
        let harness = try IngestHarness()
        let form = "latitude=52.5&longitude=13.4&device=pixel&accuracy=7.5&battery=64&speed=12.5&direction=90&altitude=40&time=2025-03-01T10%3A00%3A00.250Z"
        let post = await harness.send("POST", "/gpslogger", headers: ["Authorization": "Bearer \(IngestHarness.token)", "Content-Type": "application/x-www-form-urlencoded"], body: form)
        #expect(post.status == 200)
        let get = await harness.send("GET", "/gpslogger", query: "lat=52.6&lon=13.5&timestamp=1740823200&spd=3&token=\(IngestHarness.token)", headers: [:])
        #expect(get.status == 200)
        let fixes = harness.published.fixes
        #expect(fixes == [
            Fix(seq: 1, device: "car", time: date("2025-03-01T10:00:00.250Z"), lat: 52.5, lon: 13.4, accuracyM: 7.5, altitudeM: 40,
                speedMps: 12.5, courseDeg: 90, battery: 0.64, source: .gpslogger, meta: ["device": "pixel"]),
            Fix(seq: 2, device: "car", time: Date(timeIntervalSince1970: 1_740_823_200), lat: 52.6, lon: 13.5, speedMps: 3, source: .gpslogger),
        ])
        harness.journal.shutdown()
    }

    /// Times and numbers as strings may carry spaces, ASCII or not, at either end.
    @Test func spacesAroundTimesAndNumbersAreTrimmed() async throws {
        let harness = try IngestHarness()
        let body = #"{"fixes":[{"time":" 2025-05-05T05:05:05Z\t","lat":" 1.5","lon":"2 ","device":"car"},"#
            + #"{"time":"\u00a0 1746421506\u2009","lat":" \u00a01.5 ","lon":2,"device":"car"}]}"#
        let fixes = await harness.send("POST", "/api/v1/fixes", body: body)
        #expect(String(decoding: fixes.body, as: UTF8.self) == #"{"accepted":2,"duplicates":0,"last_seq":2}"#)
        #expect(harness.published.fixes.map(\.time) == [date("2025-05-05T05:05:05Z"), date("2025-05-05T05:05:06Z")])
        #expect(harness.published.fixes.map(\.lat) == [1.5, 1.5])
        harness.journal.shutdown()
    }

    @Test func nativeAPIMotionAndCheckin() async throws {
        let harness = try IngestHarness()
        let fixes = await harness.send("POST", "/api/v1/fixes", body: #"{"fixes":[{"time":"2025-05-05T05:05:05.5Z","lat":"1.5","lon":2,"speed_mps":-1,"device":"car"}]}"#)
        #expect(String(decoding: fixes.body, as: UTF8.self) == #"{"accepted":1,"duplicates":0,"last_seq":1}"#)
        let motion = await harness.send("POST", "/api/v1/motion", body: #"{"samples":[{"start":"2025-05-05T05:06:00Z","activity":"walking","confidence":"high"},{"start":"2025-05-05T05:07:00Z","activity":"walking","confidence":"high"}]}"#)
        #expect(String(decoding: motion.body, as: UTF8.self) == #"{"accepted":2,"duplicates":0,"last_seq":3}"#)
        let checkin = await harness.send("POST", "/api/v1/taxi/checkin", body: #"{"time":"2025-05-05T05:00:00Z"}"#)
        #expect(checkin.status == 200)
        #expect(harness.published.all.map(\.topic) == ["fix.car", "motion.car", "motion.car", "taxi.checkin.car"])
        #expect(harness.published.fixes[0].speedMps == nil)
        #expect(try BusJSON.decode(TaxiCheckin.self, from: harness.published.all[3].payload) == TaxiCheckin(seq: 4, device: "car", time: date("2025-05-05T05:00:00Z")))
        harness.journal.shutdown()
    }

    static let badInput: [(String, String, String, Int, String)] = [
        // (path, body, description, status, field)
        ("/api/v1/fixes", #"{"fixes":[{"time":"2025-01-01T00:00:00Z","lat":91,"lon":0}]}"#, "latitude out of range", 400, "fixes[0].lat"),
        ("/api/v1/fixes", #"{"fixes":[{"time":"2025-01-01T00:00:00Z","lat":0,"lon":-180.5}]}"#, "longitude out of range", 400, "fixes[0].lon"),
        ("/api/v1/fixes", #"{"fixes":[{"time":"2025-01-01T00:00:00Z","lat":"NaN","lon":0}]}"#, "NaN", 400, "fixes[0].lat"),
        ("/api/v1/fixes", #"{"fixes":[{"time":"2025-01-01T00:00:00Z","lat":"inf","lon":0}]}"#, "infinity", 400, "fixes[0].lat"),
        ("/api/v1/fixes", #"{"fixes":[{"time":"2025-01-01T00:00:00Z","lat":1e999,"lon":0}]}"#, "overflowing number", 400, "body"),
        ("/api/v1/fixes", #"{"fixes":[{"time":"last tuesday","lat":1,"lon":0}]}"#, "unparseable time", 400, "fixes[0].time"),
        ("/api/v1/fixes", #"{"fixes":[{"time":"2030-01-01T00:00:00Z","lat":1,"lon":0}]}"#, "time in the future", 400, "fixes[0].time"),
        ("/api/v1/fixes", #"{"fixes":[{"time":"1999-12-31T23:59:59Z","lat":1,"lon":0}]}"#, "time before 2000", 400, "fixes[0].time"),
        ("/api/v1/fixes", #"{"fixes":[{"time":"2025-01-01T00:00:00Z","lat":1}]}"#, "missing lon", 400, "fixes[0].lon"),
        ("/owntracks", #"{"_type":"location","lat":1,"lon":2,"tst":1700000000,"tid":"\#(String(repeating: "x", count: 257))"}"#, "a tid over 256 bytes", 400, "tid"),
        ("/api/v1/sessions/start", #"{"candidate":"Anna","note":"\#(String(repeating: "n", count: 2001))"}"#, "a note over 2000 bytes", 400, "note"),
        ("/api/v1/fixes", #"{"fixes":[{"time":"2025-01-01T00:00:00Z","lat":1,"lon":2},"#, "malformed JSON", 400, "body"),
        ("/api/v1/fixes", #"["fixes"]"#, "not an object", 400, "body"),
        ("/api/v1/fixes", #"{"fixes":[{"time":"2025-01-01T00:00:00Z","lat":1,"lon":2,"device":"bike"}]}"#, "another device", 403, "fixes[0].device"),
        ("/api/v1/motion", #"{"samples":[{"start":"2025-01-01T00:00:00Z","activity":"flying","confidence":"high"}]}"#, "unknown activity", 400, "samples[0].activity"),
        ("/overland", #"{"locations":[{"type":"Feature","geometry":{"type":"Point","coordinates":[200,1]},"properties":{"timestamp":"2025-01-01T00:00:00Z"}}]}"#, "overland longitude", 400, "locations[0].geometry.coordinates[0]"),
        ("/overland", #"{"locations":[{"type":"Feature","geometry":{"type":"Point","coordinates":[1,1]},"properties":{}}]}"#, "overland timestamp", 400, "locations[0].properties.timestamp"),
        // Overland is read in one pass; the whole body is checked before any field is judged.
        ("/overland", #"{"locations":"many","more":[}"#, "overland malformed after a wrong field", 400, "body"),
        ("/overland", #"{"locations":[{"geometry":{"coordinates":[1,1]},"properties":{"wifi":\#(String(repeating: "[", count: 61) + String(repeating: "]", count: 61))}}]}"#, "overland nested too deeply", 400, "body"),
        ("/overland", #"{"locations":[\#(Array(repeating: "{}", count: IngestLimits.batchItems + 1).joined(separator: ","))]}"#, "overland batch too large", 413, "locations"),
        ("/overland", #"{"locations":null}"#, "overland locations null", 400, "locations"),
        ("/overland", #"{"locations":"many"}"#, "overland locations not a list", 400, "locations"),
        ("/overland", #"{"locations":[],"locations":"many"}"#, "overland locations given twice, the last wrong", 400, "locations"),
        ("/overland", #"{"locations":[1]}"#, "overland location not an object", 400, "locations[0]"),
        ("/overland", #"{"locations":[{"geometry":[1,1]}]}"#, "overland geometry not an object", 400, "locations[0].geometry"),
        ("/overland", #"{"locations":[{"geometry":{"coordinates":[1,1]},"properties":"x"}]}"#, "overland properties not an object", 400, "locations[0].properties"),
        ("/overland", #"{"locations":[{"geometry":{"coordinates":[1]},"properties":{"timestamp":"2025-01-01T00:00:00Z"}}]}"#, "overland one coordinate", 400, "locations[0].geometry.coordinates"),
        ("/overland", #"{"locations":[{"geometry":{"coordinates":{"lon":1}},"properties":{"timestamp":"2025-01-01T00:00:00Z"}}]}"#, "overland coordinates not a list", 400, "locations[0].geometry.coordinates"),
        ("/overland", #"{"locations":[{"geometry":{"coordinates":[1,null]},"properties":{"timestamp":"2025-01-01T00:00:00Z"}}]}"#, "overland latitude null", 400, "locations[0].geometry.coordinates[1]"),
        ("/overland", #"{"locations":[{"geometry":{"coordinates":[true,1]},"properties":{"timestamp":"2025-01-01T00:00:00Z"}}]}"#, "overland longitude a bool", 400, "locations[0].geometry.coordinates[0]"),
        ("/overland", #"{"locations":[{"geometry":{"coordinates":"1,2"},"properties":{"timestamp":"2025-01-01T00:00:00Z"}}]}"#, "overland coordinates a string", 400, "locations[0].geometry.coordinates"),
        ("/overland", #"{"locations":[{"geometry":{"coordinates":[1,2]},"properties":{"timestamp":"2025-01-01T00:00:00Z","motion":"driving"}}]}"#, "overland motion not a list", 400, "locations[0].properties.motion"),
        ("/overland", #"{"locations":[{"geometry":{"coordinates":[1,1]},"properties":{"timestamp":"2025-01-01T00:00:00Z","motion":"driving"}}]}"#, "overland motion not a list", 400, "locations[0].properties.motion"),
        ("/overland", #"{"locations":[{"geometry":{"coordinates":[1,1]},"properties":{"timestamp":"2025-01-01T00:00:00Z","speed":[]}}]}"#, "overland speed a list", 400, "locations[0].properties.speed"),
        ("/owntracks", #"{"_type":"location","lat":1,"lon":2}"#, "owntracks tst", 400, "tst"),
        ("/owntracks", #"{"lat":1,"lon":2,"tst":1700000000}"#, "owntracks _type", 400, "_type"),
        ("/owntracks", #"{"_type":"location","lat":1,"lon":2,"tst":99999999999999999999999}"#, "absurd epoch", 400, "tst"),
        ("/api/v1/fixes", #"{"fixes":[{"time":"0000-01-01T00:00:00+01:00","lat":1,"lon":2}]}"#, "year -1", 400, "fixes[0].time"),
    ]

    @Test func badInputIsRefusedNamingTheFieldAndNothingIsStored() async throws {
        let harness = try IngestHarness(now: date("2026-11-21T12:00:00Z"))
        for (path, body, description, status, field) in Self.badInput {
            let response = await harness.send("POST", path, body: body)
            #expect(response.status == status, "\(description): \(String(decoding: response.body, as: UTF8.self))")
            let error = try JSONSerialization.jsonObject(with: Data(response.body)) as? [String: [String: String]]
            #expect(error?["error"]?["field"] == field, "\(description)")
            #expect(error?["error"]?["code"]?.hasPrefix("ingest.") == true, "\(description)")
        }
        // A valid fix alongside a bad one in the same batch: the whole batch is refused.
        let mixed = await harness.send("POST", "/api/v1/fixes", body: #"{"fixes":[{"time":"2025-01-01T00:00:00Z","lat":1,"lon":2},{"time":"2025-01-01T00:00:01Z","lat":100,"lon":2}]}"#)
        #expect(mixed.status == 400)
        #expect(harness.published.count == 0)
        #expect(harness.journal.lastSeq == 0)
        harness.journal.shutdown()
    }

    @Test func impossibleReadingsAndPlaceholdersAreLeftOutTheFixIsKeptAndTheyAreCounted() async throws {
        let harness = try IngestHarness(now: date("2026-11-21T12:00:00Z"))
        let native = #"{"fixes":[{"time":"2025-01-01T00:00:00Z","lat":1,"lon":2,"battery":5,"speed_mps":9001,"accuracy_m":0,"course_deg":400,"altitude_m":12}]}"#
        #expect(await harness.send("POST", "/api/v1/fixes", body: native).status == 200)
        // GPSLogger fills what it does not know with 0; a speed of 9001 km/h is no reading either.
        let gpslogger = await harness.send("GET", "/gpslogger", query: "lat=1.5&lon=2.5&time=2025-01-01T00:01:00Z&acc=0&alt=0&batt=0&spd=9001&dir=90&token=\(IngestHarness.token)", headers: [:])
        #expect(gpslogger.status == 200)
        let fixes = harness.published.fixes
        #expect(fixes.count == 2)
        #expect(fixes.first.map { $0.lat == 1 && $0.battery == nil && $0.speedMps == nil && $0.accuracyM == nil && $0.courseDeg == nil && $0.altitudeM == 12 } == true)
        #expect(fixes.last.map { $0.lat == 1.5 && $0.accuracyM == nil && $0.altitudeM == nil && $0.battery == nil && $0.speedMps == nil && $0.courseDeg == 90 } == true)
        #expect(harness.handler.droppedReadings.snapshot == [
            "dropped_readings.battery.impossible": 1, "dropped_readings.speed_mps.impossible": 2, "dropped_readings.accuracy_m.placeholder": 2,
            "dropped_readings.course_deg.impossible": 1, "dropped_readings.altitude_m.placeholder": 1, "dropped_readings.battery.placeholder": 1,
        ])
        harness.journal.shutdown()
    }

    @Test func aBatchOfDuplicatesAnswersTheJournalsEnd() async throws {
        let harness = try IngestHarness(now: date("2026-11-21T12:00:00Z"))
        let body = #"{"fixes":[{"time":"2025-01-01T00:00:00Z","lat":1,"lon":2},{"time":"2025-01-01T00:00:01Z","lat":1,"lon":2}]}"#
        #expect(String(decoding: await harness.send("POST", "/api/v1/fixes", body: body).body, as: UTF8.self) == #"{"accepted":2,"duplicates":0,"last_seq":2}"#)
        #expect(String(decoding: await harness.send("POST", "/api/v1/fixes", body: body).body, as: UTF8.self) == #"{"accepted":0,"duplicates":2,"last_seq":2}"#)
        harness.journal.shutdown()
    }

    @Test func tokensDecideTheDevice() async throws {
        let harness = try IngestHarness()
        let body = #"{"fixes":[{"time":"2025-01-01T00:00:00Z","lat":1,"lon":2}]}"#
        let missing = await harness.send("POST", "/api/v1/fixes", headers: [:], body: body)
        #expect(missing.status == 401)
        let unknown = await harness.send("POST", "/api/v1/fixes", headers: ["Authorization": "Bearer car-token-0123456780"], body: body)
        #expect(unknown.status == 401)
        #expect(!String(decoding: unknown.body, as: UTF8.self).contains("car-token"))
        let viaQuery = await harness.send("POST", "/api/v1/fixes", query: "token=bike-token-0123456789", headers: [:], body: body)
        #expect(viaQuery.status == 200)
        // Overland's own device_id is kept as a label only.
        let overland = #"{"locations":[{"type":"Feature","geometry":{"type":"Point","coordinates":[2,1]},"properties":{"timestamp":"2025-01-01T00:00:05Z","device_id":"bike"}}]}"#
        #expect(await harness.send("POST", "/overland", body: overland).status == 200)
        #expect(harness.published.fixes.map(\.device) == ["bike", "car"])
        #expect(harness.published.fixes[1].meta == ["device_id": "bike"])
        // Traccar ids work only for devices that allow it.
        let byID = await harness.send("GET", "/", query: "id=car&lat=1&lon=2&timestamp=1700000000", headers: [:])
        #expect(byID.status == 401)
        let tooMany = "{\"fixes\":[" + Array(repeating: #"{"time":"2025-01-01T00:00:00Z","lat":1,"lon":2}"#, count: 10_001).joined(separator: ",") + "]}"
        let batch = await harness.send("POST", "/api/v1/fixes", body: tooMany)
        #expect(batch.status == 413)
        #expect(harness.published.count == 2)
        harness.journal.shutdown()
    }
}

/// `publish` (drivebus import) reads a plain batch without a JSON tree; it must store exactly what
/// the general path stores, and leave every unusual batch, and every error, to that path.
@Suite struct NativeBatchTests {
    static let plain = #"{"op":"publish","device":"car","fixes":[{"lat":48.2,"lon":16.37,"time":"2025-05-01T10:00:00.500Z","altitude_m":180.5,"speed_mps":12.25,"course_deg":360,"accuracy_m":0,"battery":0.5},{"lat":-0.0,"lon":16.38,"time":"2025-05-01T10:00:01Z","speed_mps":-1}]}"#

    /// The fixes `publishLocal` journals for `body`, and its answer or error code.
    func stored(_ body: String) async throws -> (fixes: [Fix], outcome: String) {
        let harness = try IngestHarness(now: date("2025-05-02T00:00:00Z"))
        do {
            let summary = try await harness.handler.publishLocal(body: Array(body.utf8))
            return (harness.published.fixes, "accepted \(summary.accepted)")
        } catch let error as IngestError {
            return (harness.published.fixes, "\(error.code) \(error.field ?? "")")
        }
    }

    /// A local tool's batches are journaled in the order they arrived (their numbers), though
    /// the later one was parsed first.
    @Test func localBatchesAreJournaledInArrivalOrder() async throws {
        let order = ArrivalOrder()
        let harness = try IngestHarness(now: date("2025-05-02T00:00:00Z"), arrivalOrder: order)
        let handler = harness.handler
        func batch(_ minute: Int) -> [UInt8] {
            Array(#"{"op":"publish","device":"car","fixes":[{"lat":48.2,"lon":16.37,"time":"2025-05-01T10:0\#(minute):00Z"}]}"#.utf8)
        }
        let first = order.number(), second = order.number()
        let later = Task {
            try await ArrivalOrder.$current.withValue(second) { try await handler.publishLocal(body: batch(2)) }
        }
        #expect(await eventually { order.waiting == 1 }, "the second batch waits for the first")
        #expect(harness.journal.lastSeq == 0)
        _ = try await ArrivalOrder.$current.withValue(first) { try await handler.publishLocal(body: batch(1)) }
        order.leave(first)
        _ = try await later.value
        order.leave(second)
        func journaledMinutes() throws -> [Int] {
            try harness.journal.replay(fromSeq: 1, limit: 10).map { Int(try BusJSON.decode(Fix.self, from: $0.payload).time.timeIntervalSince1970) / 60 % 60 }
        }
        #expect(try journaledMinutes() == [1, 2])
        // A number that left without journaling (a refused batch) holds nothing up.
        let refused = order.number(), next = order.number()
        order.leave(refused)
        _ = try await ArrivalOrder.$current.withValue(next) { try await handler.publishLocal(body: batch(3)) }
        order.leave(next)
        #expect(try journaledMinutes() == [1, 2, 3])
    }

    /// `drivebus import`'s binary batches store what the same fixes sent as JSON store, and a
    /// damaged one is refused naming the place, with nothing stored.
    @Test func packedBatchesStoreWhatJSONBatchesStore() async throws {
        let fixes = [
            PackedFixes.Fix(time: date("2025-05-01T10:00:00.500Z"), lat: 48.2, lon: 16.37, accuracyM: 0, altitudeM: 180.5, speedMps: 12.25, courseDeg: 360, battery: 0.5),
            PackedFixes.Fix(time: date("2025-05-01T10:00:01Z"), lat: -0.0, lon: 16.38, speedMps: -1),
        ]
        let packed = try IngestHarness(now: date("2025-05-02T00:00:00Z"))
        let summary = try await packed.handler.publishPacked(body: PackedFixes.encode(device: "car", fixes: fixes))
        #expect(summary.accepted == 2)
        // The same fixes as JSON, as `publish` takes them.
        #expect(try await stored(Self.plain).fixes == packed.published.fixes)

        var damaged = PackedFixes.encode(device: "car", fixes: fixes)
        damaged.removeLast(3)
        let refused = try IngestHarness(now: date("2025-05-02T00:00:00Z"))
        await #expect(throws: IngestError.invalid("fixes[1]", "the body ends inside it")) {
            _ = try await refused.handler.publishPacked(body: damaged)
        }
        await #expect(throws: IngestError.invalid("device", "unknown device \"van\"")) {
            _ = try await refused.handler.publishPacked(body: PackedFixes.encode(device: "van", fixes: fixes))
        }
        #expect(refused.journal.lastSeq == 0)
    }

    @Test func aPlainBatchIsStoredAsTheGeneralPathStoresIt() async throws {
        #expect(NativeBatch.isPlain(Self.plain))
        // The same fixes in a shape only the general path takes: a number as a string.
        let general = Self.plain.replacingOccurrences(of: #""lat":48.2"#, with: #""lat":"48.2""#)
        #expect(!NativeBatch.isPlain(general))
        let fast = try await stored(Self.plain), slow = try await stored(general)
        #expect(fast.outcome == "accepted 2" && slow.outcome == "accepted 2")
        #expect(fast.fixes == slow.fixes)
        #expect(fast.fixes.first?.accuracyM == nil && fast.fixes.first?.courseDeg == 0 && fast.fixes.last?.speedMps == nil)
    }

    @Test(arguments: [
        (#"{"op":"publish","device":"car","fixes":[{"lat":91,"lon":16.37,"time":"2025-05-01T10:00:00Z"}]}"#, "ingest.invalid_field fixes[0].lat"),
        (#"{"op":"publish","device":"car","fixes":[{"lat":48,"lon":16.37,"time":"2027-05-01T10:00:00Z"}]}"#, "ingest.invalid_field fixes[0].time"),
        (#"{"op":"publish","device":"car","fixes":[{"lat":48,"lon":16.37}]}"#, "ingest.invalid_field fixes[0].time"),
        (#"{"op":"publish","device":"car","fixes":[{"lat":48,"lon":16.37,"time":"2025-05-01T10:00:00Z","device":"bike"}]}"#, "ingest.forbidden fixes[0].device"),
        (#"{"op":"publish","device":"nobody","fixes":[]}"#, "ingest.invalid_field device"),
        (#"{"op":"publish","fixes":[]}"#, "ingest.invalid_field device"),
    ])
    func errorsAreTheGeneralPaths(body: String, outcome: String) async throws {
        #expect(try await stored(body).outcome == outcome)
        #expect(try await stored(body).fixes.isEmpty)
    }
}
