import ArgumentParser
import AsyncHTTPClient
import DrivebusConfiguration
import DrivebusKit
import Foundation
import NIOCore

struct Export: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Export a device's fixes as GPX, CSV or GeoJSON, from the running stats service.")

    enum Format: String, ExpressibleByArgument, CaseIterable { case gpx, csv, geojson }

    @OptionGroup var options: ConfigOption

    @Option(help: "The device.")
    var device: String

    @Option(help: "gpx, csv or geojson.")
    var format: Format

    @Option(help: "From this date (YYYY-MM-DD) or time (RFC 3339), inclusive.")
    var from: String?

    @Option(help: "Up to this date or time, exclusive.")
    var to: String?

    @Option(name: .shortAndLong, help: "Write to this file instead of standard output.")
    var output: String?

    func run() async throws {
        let config = try loadConfig(options)
        var components = URLComponents()
        components.scheme = "http"
        let host = config.stats.listen.host
        components.host = host == "0.0.0.0" ? "127.0.0.1" : (host == "::" ? "::1" : host)
        components.port = config.stats.listen.port
        components.path = "/api/v1/export/fixes.\(format.rawValue)"
        components.queryItems = [URLQueryItem(name: "device", value: device)]
            + [("from", from), ("to", to)].compactMap { name, value in value.map { URLQueryItem(name: name, value: $0) } }
        guard let url = components.url?.absoluteString else { throw ValidationError("cannot build the stats URL") }

        // Streamed to the file as it arrives: a year of 1 Hz data is never held in memory.
        let response = try await HTTPClient.shared.execute(HTTPClientRequest(url: url), timeout: .seconds(3600))
        guard response.status == .ok else {
            let body = try await response.body.collect(upTo: 64 * 1024)
            FileHandle.standardError.write(Data("drivebus export: \(response.status.code): \(String(buffer: body))\n".utf8))
            throw ExitCode(1)
        }
        let sink: FileHandle
        if let output {
            guard FileManager.default.createFile(atPath: output, contents: nil) , let handle = FileHandle(forWritingAtPath: output) else {
                throw ValidationError("cannot write \(output)")
            }
            sink = handle
        } else {
            sink = .standardOutput
        }
        var bytes = 0
        for try await chunk in response.body {
            bytes += chunk.readableBytes
            sink.write(Data(chunk.readableBytesView))
        }
        if output != nil {
            try sink.close()
            FileHandle.standardError.write(Data("wrote \(bytes) bytes to \(output!)\n".utf8))
        }
    }
}
