import ArgumentParser
import DrivebusConfiguration
import DrivebusKit
import Foundation

@main
struct DrivebusCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "drivebus",
        abstract: "Operate drivebus: the home server for your phones' location and motion data.",
        subcommands: [Up.self, Status.self, Tail.self, DeviceCommand.self, Import.self, Checkin.self, Export.self, Backup.self, Restore.self, Purge.self, Limits.self, Keygen.self]
    )
}

/// Loads the config the way every service does, or exits with the one-line error.
func loadConfig(_ options: ConfigOption) throws -> DrivebusConfig {
    do {
        return try DrivebusConfig.load(explicitPath: options.config).0
    } catch {
        FileHandle.standardError.write(Data("drivebus: \(error)\n".utf8))
        throw ExitCode(2)
    }
}

struct Up: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Start the bus and every service, restart any that dies, stop them all on SIGTERM or Ctrl-C.")

    @OptionGroup var options: ConfigOption

    func run() throws {
        let config = try loadConfig(options)
        DrivebusLogging.bootstrap(level: config.logLevel)
        // Children read the very file `up` read, wherever they resolve paths from.
        let (_, origin) = try DrivebusConfig.load(explicitPath: options.config)
        var arguments: [String] = []
        if case .file(let path) = origin { arguments = ["--config", path] }
        let executable = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0]
        let binDirectory = URL(fileURLWithPath: executable).deletingLastPathComponent().path
        let added = (try? DeviceRegistry(layout: config.layout).load()) ?? []
        if config.devices(with: added).isEmpty {
            // A fresh install: say the one thing to do next.
            let command = ([executable, "device", "add", "my-phone", "--app", "owntracks"] + arguments).joined(separator: " ")
            FileHandle.standardError.write(Data("""
                drivebus up: no phone can send yet. Add the first one (in another terminal) and scan its code:
                  \(command)

                """.utf8))
        }
        do {
            try config.layout.prepare()
            let supervisor = try Supervisor(
                settings: config.process, services: config.services, binDirectory: binDirectory, arguments: arguments, logger: .init(label: "drivebus.up"))
            supervisor.run()
        } catch {
            FileHandle.standardError.write(Data("drivebus up: \(error)\n".utf8))
            throw ExitCode(2)
        }
    }
}

struct Keygen: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Print CURVE key pairs for a bus that spans machines over tcp://.")

    func run() throws {
        let server = try CurveKeyPair.generate()
        let client = try CurveKeyPair.generate()
        print("""
            bus:
              curve:
                server_public_key: "\(server.publicKey)"
                server_secret_key: "\(server.secretKey)"   # only on the machine running drivebus-bus
                client_public_key: "\(client.publicKey)"
                client_secret_key: "\(client.secretKey)"
            """)
    }
}
