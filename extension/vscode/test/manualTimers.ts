import { Timers } from "../src/focus";

/** Timers that run only when the test advances the clock; counts what is scheduled. */
export class ManualTimers implements Timers {
  now = 0;
  private queue = new Map<number, { at: number; callback: () => void }>();
  private nextId = 1;

  setTimeout(callback: () => void, ms: number): unknown {
    const id = this.nextId++;
    this.queue.set(id, { at: this.now + ms, callback });
    return id;
  }

  clearTimeout(handle: unknown): void {
    this.queue.delete(handle as number);
  }

  advance(ms: number): void {
    this.now += ms;
    for (const [id, entry] of [...this.queue].sort((a, b) => a[1].at - b[1].at)) {
      if (entry.at <= this.now && this.queue.delete(id)) {
        entry.callback();
      }
    }
  }

  get scheduled(): number {
    return this.queue.size;
  }
}
