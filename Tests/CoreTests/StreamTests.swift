import DrivebusJournal
import DrivebusKit
import DrivebusTestSupport
import Foundation
import Testing

/// Every transition of the journal follower's state machine.
@Suite struct StreamCursorTests {
    @Test func aLiveRecordIsAppliedSkippedOrWaitsForItsGap() {
        let cursor = StreamCursor(lastApplied: 4)
        #expect(cursor.received(3) == .skip)
        #expect(cursor.received(4) == .skip)
        #expect(cursor.received(5) == .apply)
        #expect(cursor.received(9) == .fill(through: 8))
    }

    @Test func afterAFillTheRecordIsAppliedOnlyIfTheGapClosed() {
        var cursor = StreamCursor(lastApplied: 4)
        #expect(cursor.afterFill(9) == .skip)  // the replay could not reach the source
        for seq: UInt64 in 5...8 { let result = cursor.applied(seq); #expect(result) }
        #expect(cursor.afterFill(9) == .apply)
    }

    @Test func nothingIsAppliedOutOfOrder() {
        var cursor = StreamCursor(lastApplied: 4)
        do { let result = cursor.applied(6); #expect(!result) }
        do { let result = cursor.applied(4); #expect(!result) }
        #expect(cursor.lastApplied == 4)
        do { let result = cursor.applied(5); #expect(result) }
        #expect(cursor.lastApplied == 5)
    }

    @Test func anEmptySourceMakesTheCursorLiveAtOnce() {
        var cursor = StreamCursor(lastApplied: 0)
        #expect(!cursor.isLive)
        do { let result = cursor.heartbeat(claims: 0); #expect(result == nil) }
        #expect(cursor.isLive)
    }

    @Test func theCatchUpEndsOnlyWhenItReachedTheClaim() {
        var cursor = StreamCursor(lastApplied: 2)
        do { let result = cursor.heartbeat(claims: 5); #expect(result == 5) }
        do { let result = cursor.applied(3); #expect(result) }
        cursor.replayEnded()  // cut short: the source went away at seq 3
        #expect(!cursor.isLive)
        // The next heartbeat asks again, through the newer claim.
        do { let result = cursor.heartbeat(claims: 6); #expect(result == 6) }
        for seq: UInt64 in 4...6 { cursor.applied(seq) }
        cursor.replayEnded()
        #expect(cursor.isLive)
    }

    @Test func aClaimStillMissingAtTheNextHeartbeatWasLostAtTheTail() {
        var cursor = StreamCursor(lastApplied: 10)
        do { let result = cursor.heartbeat(claims: 10); #expect(result == nil) }
        #expect(cursor.isLive)
        // The source claims 12; 11 and 12 may still be in flight.
        do { let result = cursor.heartbeat(claims: 12); #expect(result == nil) }
        do { let result = cursor.applied(11); #expect(result) }
        // By the next heartbeat they must have arrived: 12 is lost.
        do { let result = cursor.heartbeat(claims: 12); #expect(result == 12) }
        do { let result = cursor.applied(12); #expect(result) }
        do { let result = cursor.heartbeat(claims: 12); #expect(result == nil) }
    }

    @Test func aCursorAheadOfItsSourceIsLiveAndSkipsWhatItHas() {
        var cursor = StreamCursor(lastApplied: 50)
        do { let result = cursor.heartbeat(claims: 20); #expect(result == nil) }
        #expect(cursor.isLive)
        #expect(cursor.received(21) == .skip)
    }
}

@Suite struct EventJournalTests {
    func event(_ id: String, type: String = "trip.ended", device: String? = "car") throws -> DerivedEvent {
        try DerivedEvent(type: type, device: device, id: id, payload: ["id": id])
    }

    @Test func appendsWithGaplessSeqsAndReadsBackExactly() async throws {
        let dir = TempDir()
        let journal = try EventJournal(path: dir.path + "/t.events")
        let time = Date(timeIntervalSince1970: 1_700_000_000.5)
        let first = try await journal.append([event("a"), event("b", device: nil)], time: time)
        let second = try await journal.append([event("c", type: "gate.fired")], time: time)
        #expect(first.map(\.seq) == [1, 2])
        #expect(second.map(\.seq) == [3])
        let read = try await journal.read(fromSeq: 2, limit: 10)
        #expect(read.map(\.id) == ["b", "c"])
        #expect(read[0].device == nil)
        #expect(read[1].topic == "gate.fired.car")
        #expect(read[1].time == time)
        #expect(String(decoding: read[1].payload, as: UTF8.self) == #"{"id":"c"}"#)
        #expect(try await journal.read(fromSeq: 4, limit: 10).isEmpty)
        #expect(try await journal.read(fromSeq: 1, limit: 2).map(\.seq) == [1, 2])
    }

    @Test func anEventDerivedAgainIsNotJournaledTwice() async throws {
        let dir = TempDir()
        let path = dir.path + "/t.events"
        _ = try await EventJournal(path: path).append([event("a"), event("b")], time: Date())
        // After a restart, the work since the last checkpoint is redone.
        let reopened = try EventJournal(path: path)
        let again = try await reopened.append([event("b"), event("c"), event("c")], time: Date())
        #expect(again.map(\.id) == ["c"])
        #expect(reopened.lastSeq == 3)
    }

    @Test func aTornLastLineIsCutAndTheJournalGoesOn() async throws {
        let dir = TempDir()
        let path = dir.path + "/t.events"
        _ = try await EventJournal(path: path).append([event("a"), event("b")], time: Date())
        let size = try FileManager.default.attributesOfItem(atPath: path)[.size] as! Int
        let handle = try #require(FileHandle(forWritingAtPath: path))
        try handle.seekToEnd()
        try handle.write(contentsOf: Data(#"{"seq":3,"type":"trip.ended","id":"#.utf8))
        try handle.close()
        let reopened = try EventJournal(path: path)
        #expect(reopened.lastSeq == 2)
        #expect(try FileManager.default.attributesOfItem(atPath: path)[.size] as! Int == size)
        #expect(try await reopened.append([event("c")], time: Date()).map(\.seq) == [3])
        #expect(try await reopened.read(fromSeq: 1, limit: 10).map(\.id) == ["a", "b", "c"])
    }

    @Test func aDamagedLineBeforeTheEndRefusesToOpen() async throws {
        let dir = TempDir()
        let path = dir.path + "/t.events"
        _ = try await EventJournal(path: path).append([event("a"), event("b")], time: Date())
        var bytes = try Data(contentsOf: URL(fileURLWithPath: path))
        bytes[3] = UInt8(ascii: "x")
        try bytes.write(to: URL(fileURLWithPath: path))
        #expect(throws: EventJournal.Failure.self) { try EventJournal(path: path) }
    }

    @Test func aLineWithASeqNoJournalHoldsIsUnreadableNotATrap() {
        // Found by the fuzzer: 1e30 does not fit a UInt64, and converting it trapped.
        for seq in ["1e30", "-1", "0", "1.5", "18446744073709551616"] {
            let line = #"{"seq":\#(seq),"type":"trip.ended","id":"a","time":"2026-01-01T00:00:00.000Z","payload":{}}"#
            #expect(LoggedEvent(line: Array(line.utf8)[...]) == nil, "\(seq)")
        }
        #expect(LoggedEvent(line: Array(#"{"seq":7,"type":"trip.ended","id":"a","time":"2026-01-01T00:00:00.000Z","payload":{}}"#.utf8)[...])?.seq == 7)
    }

    @Test func aLineIsReadWithItsPayloadsBytesAsTheyAre() {
        let payload = #"{"track":[[48.2,16.37],[48.21,16.38]],"end_time":"2026-01-01T00:10:00.000Z","device":"car"}"#
        let line = #"{"seq":3,"type":"trip.ended","device":"car","id":"trip-1","time":"2026-01-01T00:10:01.000Z","payload":\#(payload)}"#
        let event = LoggedEvent(line: Array(line.utf8)[...])
        #expect(event == LoggedEvent(seq: 3, type: "trip.ended", device: "car", id: "trip-1", time: RFC3339.parse("2026-01-01T00:10:01.000Z")!, payload: Array(payload.utf8)))
        var written: [UInt8] = []
        event?.writeLine(to: &written)
        #expect(written == Array((line + "\n").utf8))
        // No device, a null device, and what is not one line of JSON.
        #expect(LoggedEvent(line: Array(#"{"seq":1,"type":"x","device":null,"id":"a","time":"2026-01-01T00:00:00.000Z","payload":[]}"#.utf8)[...])?.device == nil)
        #expect(LoggedEvent(line: Array(#"{"seq":1,"type":"x","id":"a","time":"2026-01-01T00:00:00.000Z","payload":{}} {}"#.utf8)[...]) == nil)
        #expect(LoggedEvent(line: Array(#"{"seq":1,"type":"x","id":"a","time":"yesterday","payload":{}}"#.utf8)[...]) == nil)
    }

    @Test func aPurgeTurnsADevicesEventsAboutTheRangeIntoStandInsAndNothingElse() async throws {
        let dir = TempDir()
        let path = dir.path + "/t.events"
        let journal = try EventJournal(path: path)
        let derived = Date(timeIntervalSince1970: 1_763_000_000)
        func at(_ id: String, _ type: String, _ device: String, _ times: [String: String]) throws -> DerivedEvent {
            try DerivedEvent(type: type, device: device, id: id, payload: times.merging(["id": id]) { own, _ in own })
        }
        _ = try await journal.append([
            // A trip of the night before that ends on the day overlaps it; one of the day before does not.
            at("night", "trip.ended", "car", ["start_time": "2025-11-12T23:40:00.000Z", "end_time": "2025-11-13T00:10:00.000Z"]),
            at("before", "trip.ended", "car", ["start_time": "2025-11-12T08:00:00.000Z", "end_time": "2025-11-12T09:00:00.000Z"]),
            at("enter", "geofence.enter", "car", ["time": "2025-11-13T12:00:00.000Z"]),
            at("bike", "geofence.enter", "bike", ["time": "2025-11-13T12:00:00.000Z"]),
            at("next", "taxi.checkout", "car", ["checkin_time": "2025-11-14T00:00:00.000Z", "checkout_time": "2025-11-14T00:20:00.000Z"]),
            at("timeless", "drive.note", "car", [:]),
        ], time: derived)
        let before = try String(contentsOfFile: path, encoding: .utf8).split(separator: "\n")
        let day = RFC3339.parse("2025-11-13T00:00:00Z")!...RFC3339.parse("2025-11-13T23:59:59.999Z")!

        let removal = try await journal.remove(device: "car", from: day.lowerBound, to: day.upperBound)
        #expect(removal.events == 2)
        #expect(removal.bytesBefore == Int64(before.map { $0.utf8.count + 1 }.reduce(0, +)))
        let after = try String(contentsOfFile: path, encoding: .utf8).split(separator: "\n")
        #expect(removal.bytesAfter == Int64(after.map { $0.utf8.count + 1 }.reduce(0, +)))
        #expect(after.count == 6)
        #expect(after[0] == #"{"seq":1,"type":"removed","device":"car","id":"night","time":"2025-11-13T02:13:20.000Z","payload":{"removed":"trip.ended"}}"#)
        #expect(after[2] == #"{"seq":3,"type":"removed","device":"car","id":"enter","time":"2025-11-13T02:13:20.000Z","payload":{"removed":"geofence.enter"}}"#)
        for kept in [1, 3, 4, 5] { #expect(after[kept] == before[kept]) }

        // Read back through the swapped file, seqs and offsets as before; an event derived again
        // is known by its id; the next append follows on.
        #expect(try await journal.read(fromSeq: 2, limit: 3).map(\.id) == ["before", "enter", "bike"])
        #expect(try await journal.append([at("enter", "geofence.enter", "car", ["time": "2025-11-13T12:00:00.000Z"])], time: derived).isEmpty)
        #expect(try await journal.append([at("later", "geofence.exit", "car", ["time": "2025-11-15T12:00:00.000Z"])], time: derived).map(\.seq) == [7])
        let reopened = try EventJournal(path: path)
        #expect(try await reopened.read(fromSeq: 1, limit: 10).map(\.type) == ["removed", "trip.ended", "removed", "geofence.enter", "taxi.checkout", "drive.note", "geofence.exit"])
        // Again: nothing more to remove, and the file is left as it is.
        #expect(try await reopened.remove(device: "car", from: day.lowerBound, to: day.upperBound).events == 0)
        #expect(!FileManager.default.fileExists(atPath: path + ".rewrite"))
    }

    @Test func retentionTurnsEventsThatEndedAndWereDerivedBeforeTheCutoffIntoStandIns() async throws {
        let dir = TempDir()
        let path = dir.path + "/t.events"
        let journal = try EventJournal(path: path)
        func at(_ id: String, _ times: [String: String]) throws -> DerivedEvent {
            try DerivedEvent(type: "trip.ended", device: "car", id: id, payload: times.merging(["id": id]) { own, _ in own })
        }
        _ = try await journal.append([
            at("old", ["start_time": "2025-01-01T08:00:00.000Z", "end_time": "2025-01-01T09:00:00.000Z"]),
            // Ends after the cutoff: kept whole.
            at("across", ["start_time": "2025-01-09T23:00:00.000Z", "end_time": "2025-01-10T01:00:00.000Z"]),
        ], time: RFC3339.parse("2025-01-02T00:00:00Z")!)
        // No time of its own: goes by when it was derived.
        _ = try await journal.append([at("timeless", [:])], time: RFC3339.parse("2025-01-05T00:00:00Z")!)
        let cutoff = RFC3339.parse("2025-01-10T00:00:00Z")!
        #expect(try await journal.expire(before: cutoff).events == 2)
        #expect(try await journal.read(fromSeq: 1, limit: 10).map(\.type) == ["removed", "trip.ended", "removed"])
        #expect(try await journal.expire(before: cutoff).events == 0)
        // An event about an old time derived later (an import) stays for the retention's length
        // from when it was derived: a consumer that was down has that long to read it.
        _ = try await journal.append([at("imported", ["time": "2024-06-01T12:00:00.000Z"])], time: RFC3339.parse("2025-11-13T00:00:00Z")!)
        #expect(try await journal.expire(before: cutoff).events == 0)
        #expect(try await journal.expire(before: RFC3339.parse("2025-12-01T00:00:00Z")!).events == 2)
        let reopened = try await EventJournal(path: path).read(fromSeq: 1, limit: 10)
        #expect(reopened.map(\.id) == ["old", "across", "timeless", "imported"] && reopened.allSatisfy { $0.type == "removed" })
    }

    @Test func anInvalidEventIsRefusedAndNothingIsWritten() async throws {
        let dir = TempDir()
        let journal = try EventJournal(path: dir.path + "/t.events")
        await #expect(throws: EventJournal.Failure.self) {
            try await journal.append([try event("ok"), try event("bad id")], time: Date())
        }
        #expect(journal.lastSeq == 0)
        #expect(try await journal.read(fromSeq: 1, limit: 10).isEmpty)
    }
}

/// Ingest's `replay` reply as a follower reads it.
@Suite struct ReplayPageTests {
    @Test func payloadsPassThroughByteForByte() throws {
        // Keys out of order, spaces and an escaped string: a tree written again would change them.
        let payload = #"{"seq":7, "z":1,"a":[1.50,"x\"y"],"device":"car"}"#
        let reply = #"{"ok":true,"last_seq":9,"messages":[{"seq":7,"topic":"fix.car","payload":\#(payload)},{"seq":8,"topic":"motion.car","payload":{}}]}"#
        let page = try ReplayPage(reply: Array(reply.utf8))
        #expect(page.lastSeq == 9)
        #expect(page.messages.map(\.seq) == [7, 8])
        #expect(page.messages.map(\.topic) == ["fix.car", "motion.car"])
        #expect(page.messages.first?.payload == Array(payload.utf8))
        #expect(page.messages.last?.payload == Array("{}".utf8))
    }

    @Test func anEventsPageKeepsEachPayloadsBytes() throws {
        let payload = #"{"trip_id":"car-1", "track":[[48.2,16.30],[48.2,16.31]]}"#
        let line = #"{"seq":4,"type":"trip.ended","device":"car","id":"trip.ended-car-1","time":"2026-11-21T09:00:00.000Z","payload":\#(payload)}"#
        let page = try EventsRPC.page(reply: Array(#"{"ok":true,"last_seq":5,"events":[\#(line)]}"#.utf8))
        #expect(page.lastSeq == 5)
        #expect(page.records.map(\.seq) == [4])
        #expect(page.records.first?.payload == Array(payload.utf8))
        #expect(throws: RPCErrorBody.badRequest("events reply holds an unreadable event")) {
            try EventsRPC.page(reply: Array(#"{"ok":true,"last_seq":5,"events":[{"seq":0,"type":"x","id":"a","time":"2026-11-21T09:00:00.000Z","payload":{}}]}"#.utf8))
        }
    }

    /// A page's payloads are framed by their length and taken without being read; a wrong
    /// length makes the page fail (and a follower replay it), never a record cut short.
    @Test func framedPayloadsAreTakenAsFramedAndAWrongFrameFailsThePage() throws {
        let payloads = [#"{"seq":7,"device":"car","note":"}"}"#, "{}"]
        var page = JournalPage.Builder()
        page.append(seq: 7, topic: "fix.car", payload: Array(payloads[0].utf8))
        page.append(seq: 8, topic: "motion.car", payload: Array(payloads[1].utf8))
        let taken = page.take()
        let bytes = try #require(taken).payload
        let text = String(decoding: bytes, as: UTF8.self)
        #expect(text.contains(#""payload_bytes":\#(payloads[0].utf8.count),"#))
        let records = try JournalPage.decode(bytes)
        #expect(records.map(\.seq) == [7, 8])
        #expect(records.map { String(decoding: $0.payload, as: UTF8.self) } == payloads)
        // Two bytes short ends on the brace inside the string, one long takes the element's
        // brace: both fail.
        for wrong in [payloads[0].utf8.count - 2, payloads[0].utf8.count + 1] {
            let broken = text.replacingOccurrences(of: #""payload_bytes":\#(payloads[0].utf8.count),"#, with: #""payload_bytes":\#(wrong),"#)
            #expect(throws: JSONReader.Failure.self) { try JournalPage.decode(Array(broken.utf8)) }
        }
        // A frame that does not fit (too short to be an object, past the end, not ending in a
        // brace) is read through instead.
        for wrong in [1, 100_000, payloads[0].utf8.count - 1] {
            let misframed = text.replacingOccurrences(of: #""payload_bytes":\#(payloads[0].utf8.count),"#, with: #""payload_bytes":\#(wrong),"#)
            #expect(try JournalPage.decode(Array(misframed.utf8)).map { String(decoding: $0.payload, as: UTF8.self) } == payloads)
        }
        // Without the frame, the payload is read through (and checked).
        #expect(try JournalPage.decode(Array(#"{"messages":[{"seq":1,"topic":"fix.car","payload":{"a":[1]}}]}"#.utf8)).first?.payload == Array(#"{"a":[1]}"#.utf8))
    }

    @Test func aFailureOrABrokenReplyIsAnError() {
        #expect(throws: RPCErrorBody(code: "replay.failed", message: #"{"ok":false,"error":{"code":"ingest.journal_io","message":"disk"}}"#)) {
            try ReplayPage(reply: Array(#"{"ok":false,"error":{"code":"ingest.journal_io","message":"disk"}}"#.utf8))
        }
        #expect(throws: RPCErrorBody.badRequest("replay reply lacks last_seq")) { try ReplayPage(reply: Array(#"{"ok":true,"messages":[]}"#.utf8)) }
        #expect(throws: RPCErrorBody.self) { try ReplayPage(reply: Array(#"{"ok":true,"last_seq":1,"messages":[{"seq":1,"topic":"fix.car","payload":{"lat":}}]}"#.utf8)) }
    }
}

@Suite struct CheckpointPacingTests {
    @Test func aSmallStateIsSavedEachIntervalALargeOneAtTheByteRate() {
        let pacing = CheckpointPacing()  // 1 s, 16 KiB/s, 200,000 messages
        #expect(pacing.gap(afterSaving: 0) == .seconds(1))
        #expect(pacing.gap(afterSaving: 16_384) == .seconds(1))
        #expect(pacing.gap(afterSaving: 32_768) == .seconds(2))
        // Five hours of one open trip in the trips service's checkpoint.
        #expect(pacing.gap(afterSaving: 1_383_220) == .milliseconds(84_425))
        #expect(CheckpointPacing(interval: .seconds(5), bytesPerSecond: 1_000_000).gap(afterSaving: 2_000_000) == .seconds(5))
    }

    @Test func aFloodMakesASaveDueBeforeItsGap() {
        let pacing = CheckpointPacing()
        #expect(!pacing.isDue(since: .seconds(84), afterSaving: 1_383_220, messages: 84))
        #expect(pacing.isDue(since: .milliseconds(84_425), afterSaving: 1_383_220, messages: 84))
        #expect(!pacing.isDue(since: .seconds(3), afterSaving: 1_383_220, messages: 199_999))
        #expect(pacing.isDue(since: .seconds(3), afterSaving: 1_383_220, messages: 200_000))
    }
}
