import CQREncode
import Foundation

/// A QR code made by libqrencode (Debian's `libqrencode-dev`), drawn for a terminal or as SVG.
/// Only the module matrix crosses from C: the library's struct is freed before `init` returns.
public struct QRCode: Sendable, Equatable {
    /// Modules per side.
    public let size: Int
    /// Row-major, `true` for a dark module.
    public let modules: [Bool]

    public enum Failure: Error, Equatable, CustomStringConvertible {
        /// The text does not fit a QR code at the chosen error correction, or is empty.
        case cannotEncode(bytes: Int)

        public var description: String {
            switch self {
            case .cannotEncode(let bytes): "cannot make a QR code of \(bytes) bytes"
            }
        }
    }

    /// Encodes `text` as bytes (8-bit mode), error correction M: readable from a screen with a
    /// fifth of it smudged, and small enough for a setup link of a few hundred bytes.
    public init(_ text: String) throws(Failure) {
        let bytes = Array(text.utf8)
        guard !bytes.isEmpty else { throw .cannotEncode(bytes: 0) }
        let made = bytes.withUnsafeBufferPointer { buffer in
            QRcode_encodeData(Int32(buffer.count), buffer.baseAddress, 0, QR_ECLEVEL_M)
        }
        guard let code = made else { throw .cannotEncode(bytes: bytes.count) }
        defer { QRcode_free(code) }
        let width = Int(code.pointee.width)
        size = width
        // Bit 0 of each byte is the module's colour; the others are the library's bookkeeping.
        modules = (0..<(width * width)).map { code.pointee.data[$0] & 1 == 1 }
    }

    public func isDark(_ x: Int, _ y: Int) -> Bool {
        x >= 0 && y >= 0 && x < size && y < size && modules[y * size + x]
    }

    /// Two rows of modules per line of half blocks, light on dark as `qrencode -t UTF8` draws it,
    /// so a scanner reads it off a dark terminal; a quiet zone of `margin` modules around it.
    public func terminal(margin: Int = 2) -> String {
        var lines: [String] = []
        var y = -margin
        while y < size + margin {
            var line = ""
            for x in -margin..<(size + margin) {
                switch (isDark(x, y), isDark(x, y + 1)) {
                case (false, false): line += "█"
                case (false, true): line += "▀"
                case (true, false): line += "▄"
                case (true, true): line += " "
                }
            }
            lines.append(line)
            y += 2
        }
        return lines.joined(separator: "\n") + "\n"
    }

    /// An SVG of one path (a square per dark module), dark on white, with a quiet zone of
    /// `margin` modules.
    public func svg(moduleSize: Int = 4, margin: Int = 4) -> String {
        let side = (size + 2 * margin) * moduleSize
        var path = ""
        for y in 0..<size {
            for x in 0..<size where isDark(x, y) {
                path += "M\(x + margin) \(y + margin)h1v1h-1z"
            }
        }
        return #"<svg xmlns="http://www.w3.org/2000/svg" width="\#(side)" height="\#(side)" viewBox="0 0 \#(size + 2 * margin) \#(size + 2 * margin)" shape-rendering="crispEdges">"#
            + ##"<rect width="100%" height="100%" fill="#fff"/><path fill="#000" d="\##(path)"/></svg>"##
    }
}
