import Foundation
import ArgumentParser

/// `--config FILE`, which every drivebus executable takes.
public struct ConfigOption: ParsableArguments {
    @Option(name: .long, help: "YAML config file (default: $DRIVEBUS_CONFIG, then ./drivebus.yaml, then built-in defaults).")
    public var config: String?

    public init() {}
}

/// The command line every service executable shares: `drivebus-<service> [--config FILE]`.
struct ServiceArguments: ParsableCommand {
    static var configuration: CommandConfiguration {
        CommandConfiguration(
            commandName: CommandLine.arguments.first.map { String($0.split(separator: "/").last ?? "") },
            abstract: "A drivebus service. `drivebus up` starts every service; run one alone under systemd.")
    }

    @OptionGroup var options: ConfigOption
}

extension ServiceRunner {
    /// The whole `main` of a service executable: parses `--config`, runs, and exits with the
    /// runner's status (0 after a clean shutdown, 2 for a bad config, 1 for a failure).
    public static func main<Config: ServiceConfiguration>(
        _ name: ServiceName,
        configuration: Config.Type,
        build: @Sendable (ServiceContext, Config) async throws -> ServiceParts = { _, _ in ServiceParts() }
    ) async -> Never {
        let arguments = ServiceArguments.parseOrExit()
        let status = await run(name, configPath: arguments.options.config, configuration: configuration, build: build)
        exit(status)
    }
}
