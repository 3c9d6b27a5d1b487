// The device page's lease, renewed from a worker: the page's main thread can be busy in wasm for
// seconds at a time (one session.run), and a worker's timer still fires then. Told {url, page_id,
// interval_ms} it beats; told null it stops. It says 'lost' when the server answers that this page no
// longer holds its device.

let timer = null;

onmessage = ({ data }) => {
  clearInterval(timer);
  if (!data) return;
  const beat = async () => {
    try {
      const response = await fetch(data.url, {
        method: 'POST',
        headers: { 'Content-Type': 'application/json' },
        body: JSON.stringify({ page_id: data.page_id }),
      });
      if (response.status === 409) postMessage('lost');
    } catch {
      // The network blipped or the server has stopped: the next beat tries again.
    }
  };
  beat();
  timer = setInterval(beat, data.interval_ms);
};
