import DrivebusFuzz
import DrivebusTestSupport
import Testing

/// A short seeded fuzz run of every parser a client, a file or the bus can reach (long runs:
/// `drivebus-bench fuzz --cases 100000`). A crash fails the whole run.
@Suite struct FuzzTests {
    @Test func ingestAnswersEveryMutationBelow500AndStoresNothingItRefuses() async throws {
        try await offThePool {
            let report = try await Fuzz.ingest(cases: 3000, seed: 1)
            #expect(report.isClean, "\(report)")
            // Both paths were taken: some mutations are still valid, most are refused.
            #expect(report.statuses[200, default: 0] > 100 && report.statuses[400, default: 0] > 500, "\(report.statuses)")
        }
    }

    @Test func busDecodersSurviveEveryMutation() async {
        await offThePool {
            let report = Fuzz.bus(cases: 5000, seed: 2)
            #expect(report.isClean, "\(report)")
        }
    }
}

extension FuzzTests {
    @Test func statsAnswersEveryMutationBelow500() async throws {
        try await offThePool {
            let report = try await Fuzz.stats(cases: 1000, seed: 3)
            #expect(report.isClean, "\(report)")
            #expect(report.statuses[400, default: 0] > 200, "\(report.statuses)")
        }
    }

    @Test func trackFilesAreReadOrRefusedNeverCrash() async throws {
        try await offThePool {
            let report = try Fuzz.files(cases: 1500, seed: 4)
            #expect(report.isClean, "\(report)")
        }
    }
}
