from langchain_normrank import NormRankRetriever
from normrank import Weights

texts = [
    "The Eiffel Tower is a wrought-iron lattice tower in Paris.",
    "Photosynthesis turns light, water and carbon dioxide into sugar in green plants.",
    "The Great Wall of China stretches across northern China.",
    "Mitochondria produce most of the chemical energy a cell needs.",
]
retriever = NormRankRetriever.from_texts(texts, k=2, weights=Weights(a=0.02))
for doc in retriever.invoke("How do plants turn light into energy?"):
    m = doc.metadata
    print(f"{m['relevance_score']:.3f} (cos {m['cosine']:.3f}, g(d) {m['norm_feature']:+.2f})  {doc.page_content}")
