import DrivebusSchema

/// score = 100 − Σ weight(type) × harsh events of that type per 100 km
///             − weight(speeding) × speeding seconds per hour, clamped to 0…100.
/// Rates are taken over at least `score_min_distance_km` and `score_min_duration_s`, so a short
/// hop is not condemned by one event. docs/scoring.md gives the reason for each weight.
struct Score {
    let score: Double
    let counts: [String: Int]
    let eventsPer100km: Double

    init(events: [DriveEvent], distanceM: Double, durationS: Double, speedingS: Double, tuning: Tuning) {
        var byType: [DriveEventType: Int] = [:]
        for event in events { byType[event.type, default: 0] += 1 }
        var counts: [String: Int] = [:]
        for type in DriveEventType.allCases { counts[type.rawValue] = byType[type] ?? 0 }
        self.counts = counts

        let km = max(distanceM.isFinite ? distanceM / 1000 : 0, tuning.minDistanceKm)
        let hours = max(durationS.isFinite ? durationS : 0, tuning.minDurationS) / 3600
        func per100km(_ type: DriveEventType) -> Double { Double(byType[type] ?? 0) * 100 / km }
        let w = tuning.weights
        let penalty = w.harshBrake * per100km(.harshBrake) + w.harshAccel * per100km(.harshAccel)
            + w.harshCorner * per100km(.harshCorner) + w.speedingSPerH * speedingS / hours
        score = rounded(min(max(100 - penalty, 0), 100), 1)
        eventsPer100km = rounded(per100km(.harshBrake) + per100km(.harshAccel) + per100km(.harshCorner), 2)
    }
}
