/** Tests read /metrics with the parser `dsec top` uses (parse-prometheus-text-format, flattened). */
export { parsePromText, type Sample, type Scrape } from '../../src/cli/top/prom-text.js';
