package retention

import (
	"fmt"
	"math"
	"strconv"
	"time"
)

// rabbitAgeUnits are the units RabbitMQ accepts in a stream's max-age, with
// the lengths it gives them (rabbit_amqqueue:check_max_age): a year is 365
// days, a month 30 days.
var rabbitAgeUnits = map[string]time.Duration{
	"Y": 365 * 24 * time.Hour,
	"M": 30 * 24 * time.Hour,
	"D": 24 * time.Hour,
	"h": time.Hour,
	"m": time.Minute,
	"s": time.Second,
}

// ParseRabbitMaxAge parses a RabbitMQ stream max-age such as "7D", "1h",
// "30m", "1Y", "1M" or "10s": a positive integer and one unit, case
// sensitive (M is months, m minutes).
func ParseRabbitMaxAge(s string) (time.Duration, error) {
	i := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	unit, ok := rabbitAgeUnits[s[i:]]
	if i == 0 || !ok {
		return 0, fmt.Errorf("max-age %q must be a positive integer followed by one of Y, M, D, h, m, s", s)
	}
	n, err := strconv.ParseInt(s[:i], 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("max-age %q must be a positive integer followed by one of Y, M, D, h, m, s", s)
	}
	if n > math.MaxInt64/int64(unit) {
		return 0, fmt.Errorf("max-age %q is too long", s)
	}
	return time.Duration(n) * unit, nil
}
